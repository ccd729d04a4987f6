"""Which float type a CPU computes fast: bf16 only where it has native bf16 matrix products.

Without AVX512-BF16 or AMX, torch multiplies bf16 matrices by a generic path. Measured on this project's CI kind
(AMD EPYC, AVX2 only; one thread, torch 2.13.0): a 512-token forward of the embedded 0.5B model took 142 s in
bf16 against 27.5 s in float32, and the trainer's head-gradient product (64 rows x 151,936 x 896) 161 s against
1.4 s. There a bf16 model is only a way to halve memory, and whatever runs many matrix products (the prompt's
prefill, every update of the trainer) runs a float32 copy instead.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """True where bf16 matrix products have hardware support; unknown platforms count as supported."""
    try:
        flags = cpuinfo.read_text()
    except OSError:
        return True
    return any(flag in flags for flag in _NATIVE_BF16_FLAGS)


def slow_bf16(model: Any, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether `model` holds bf16 weights on a CPU that lacks native bf16 matrix products."""
    import torch

    param = next(model.parameters())
    return param.device.type == "cpu" and param.dtype == torch.bfloat16 and not cpu_has_native_bf16(cpuinfo)
