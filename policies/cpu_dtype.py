"""Which float type a CPU computes fast: bf16 only where torch has fast bf16 matrix products for it.

Without oneDNN's bf16 kernels (they need AVX512 or Arm's bf16), torch multiplies bf16 matrices by a generic
path. Measured on this project's CI kind (AMD EPYC, AVX2 only; one thread, torch 2.13.0): a 512-token forward
of the embedded 0.5B model took 142 s in bf16 against 27.5 s in float32, and the trainer's head-gradient product
(64 rows x 151,936 x 896) 161 s against 1.4 s. There a bf16 model only halves memory, and whatever runs many
matrix products runs in float32 instead: the prompt's prefill through a float32 twin, the trainer on the model it
trains, cast (a copy of its own behind llama.cpp; an in-process policy's shared model, which then samples in
float32 too).
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


def bf16_matmul_is_fast(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """torch's own test for its oneDNN bf16 kernels (AVX512 BW/VL/DQ or better, or Arm's bf16), without which its
    bf16 products take the slow generic path above; where torch cannot say, the CPU's native bf16 flags."""
    try:
        import torch

        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (ImportError, AttributeError, RuntimeError):
        return cpu_has_native_bf16(cpuinfo)


def slow_bf16(model: Any, fast: bool | None = None) -> bool:
    """Whether `model` holds bf16 weights on a CPU where bf16 products are slow (`fast`: this CPU's answer)."""
    import torch

    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.bfloat16:
        return False
    return not (bf16_matmul_is_fast() if fast is None else fast)
