"""The tokenizer of a GGUF model: transformers' files beside it where there are some, else the one the file holds.

Why: a published GGUF carries its tokenizer (tokens, merges, special ids, chat template), and llama.cpp samples from
the file alone; asking for tokenizer.json beside it stopped `llama:PATH.gguf` on most downloads. transformers reads
a GGUF's tokenizer (`from_pretrained(folder, gguf_file=name)`, with the `gguf` package), but reading a 152k-token
vocabulary out of the file took 181 s on this project's busy 2-core machine, so it is read once and saved in the
model cache (`EVOLVE_CACHE`), keyed by the file's path, size and modification time.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from policies.build_lock import building
from policies.embedded import cache_root
from policies.policy import PolicyError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def has_tokenizer_files(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def _cache_folder(gguf: Path) -> Path:
    """This file's tokenizer in the model cache: a new download (or an edit) of the same path is another key."""
    stat = gguf.stat()
    key = f"{gguf.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}"
    return cache_root() / "tokenizers" / hashlib.sha256(key.encode()).hexdigest()[:16]


def model_tokenizer(folder: Path, gguf: Path) -> Any:
    """The tokenizer files in `folder` (a checkpoint's, or those saved beside the GGUF) where there are some, else the
    tokenizer the GGUF file holds."""
    if not has_tokenizer_files(folder):
        return gguf_tokenizer(gguf)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder)
    except (OSError, ValueError) as exc:
        raise PolicyError(f"the tokenizer files next to {gguf} do not load: {str(exc).splitlines()[0]}") from None


def tokenizer_cached(gguf: Path) -> bool:
    """Whether the GGUF's tokenizer was read into the model cache already."""
    return gguf.is_file() and (_cache_folder(gguf) / ".complete").is_file()


def gguf_tokenizer(gguf: Path) -> Any:
    """The tokenizer the GGUF file holds, read from the file once and from the model cache afterwards."""
    from transformers import AutoTokenizer

    cached = _cache_folder(gguf)
    done = cached / ".complete"
    if not done.is_file():
        with building(cached.parent, f"the tokenizer of {gguf.name}"):
            if not done.is_file():
                _save(_read(gguf), cached)
    return AutoTokenizer.from_pretrained(cached)


def _read(gguf: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except ImportError as exc:
        raise PolicyError(f"reading the tokenizer of {gguf} needs the gguf package ({exc}); pip install gguf") from None
    except Exception as exc:  # transformers raises many kinds on a file it cannot read: each is this one answer
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise PolicyError(
            f"{gguf}: neither tokenizer files beside it nor a tokenizer in the file that transformers reads ({first}); "
            "put the model's tokenizer.json and tokenizer_config.json in its folder"
        ) from None


def _save(tokenizer: Any, cached: Path) -> None:
    """Saved under a staging name, then renamed: a save cut halfway leaves nothing that looks complete."""
    staging = cached.with_name(cached.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        tokenizer.save_pretrained(staging)
        (staging / ".complete").write_text("")
        shutil.rmtree(cached, ignore_errors=True)
        staging.replace(cached)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise PolicyError(f"{cached}: cannot save the GGUF's tokenizer ({exc.strerror}); set EVOLVE_CACHE") from None
