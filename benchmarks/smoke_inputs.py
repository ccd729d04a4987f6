"""What the benchmarks' smoke runs are given in place of the real thing: a tiny model, the study's archives.

A benchmark's SMOKE_ARGS (benchmarks/suite.py) are literal, so that the suite can read them without importing
the module; a path that exists only once made (the tiny model's folder, the unpacked study) is written there as
a placeholder, filled in here just before the run:

- `{tiny_model}`: an untaught tiny causal LM (policies/tiny.py: byte-level tokenizer, Qwen2, h128, 2 layers)
  saved in a cache folder, so a benchmark that samples or trains runs real forward passes in milliseconds
  instead of the embedded 0.5B model's seconds. Untaught, it writes no valid program: a smoke run checks that
  the benchmark runs end to end and prints its result line, not what it finds.
- `{study}`: the closed-loop study's folder with its archives unpacked (study_archives.py);
- `{scratch}`: a fresh empty folder, for a benchmark that writes its work somewhere (left in the temp folder).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from benchmarks.study_archives import study_folder


def tiny_model_dir() -> Path:
    """The untaught tiny model's folder, made once (a second or two) and kept in the cache."""
    given = os.environ.get("EVOLVE_CACHE")
    root = Path(given).expanduser() if given else Path.home() / ".cache" / "vpo-evolve"
    target = root / "smoke-models" / "untaught-tiny"
    if (target / ".complete").is_file():
        return target
    from policies.tiny import tiny_model, tiny_tokenizer

    target.mkdir(parents=True, exist_ok=True)
    tokenizer = tiny_tokenizer()
    tiny_model(tokenizer).save_pretrained(target)
    tokenizer.save_pretrained(target)
    (target / ".complete").write_text("")
    return target


def scratch_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="benchmark-smoke-"))


PLACEHOLDERS = {"{tiny_model}": tiny_model_dir, "{study}": study_folder, "{scratch}": scratch_dir}


def filled(args: tuple[str, ...]) -> list[str]:
    """`args` with each placeholder replaced by its path (made on first use)."""
    out = []
    for arg in args:
        for key, make in PLACEHOLDERS.items():
            if key in arg:
                arg = arg.replace(key, str(make()))
        out.append(arg)
    return out
