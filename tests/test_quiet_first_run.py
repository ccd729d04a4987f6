"""The first run prepares the embedded model (join, llama.cpp's Q8_0 copy, transformers' safetensors) with its logs in
the model cache's build.log and one line in the terminal; a later run prints nothing of it.

The real first-run path, `LlamaPolicy.load("embedded")` in a fresh process with a fresh EVOLVE_CACHE, on a tiny
Qwen2 (its GGUF written by policies/gguf_export.py) published as three small part packages in place of the 0.5B's
six: the process is the real one, only the parts it joins are small.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import need_llama

pytestmark = pytest.mark.slow

LOAD = """
import json, sys
from dataclasses import replace
sys.path.insert(0, sys.argv[1])
import policies.embedded as embedded
parts = json.loads(sys.argv[2])
embedded.EMBEDDED = replace(embedded.EMBEDDED, packages=tuple(parts["packages"]))
embedded.GGUF_SHA256 = parts["sha256"]
from policies.llama_policy import LlamaPolicy
policy = LlamaPolicy.load("embedded")
print("loaded", policy.runtime.n_vocab, flush=True)
policy.close()
"""


def _published(site: Path, gguf: Path) -> dict[str, object]:
    """The GGUF cut into three part packages under `site`, as the embedded model's wheels lay them out."""
    data = gguf.read_bytes()
    cut = [0, len(data) // 3, 2 * len(data) // 3, len(data)]
    names = []
    for i in range(3):
        name = f"tiny_embedded_part{i + 1}"
        (site / name / "data").mkdir(parents=True)
        (site / name / "__init__.py").write_text("")
        (site / name / "data" / f"part{i + 1:02d}.bin").write_bytes(data[cut[i] : cut[i + 1]])
        names.append(name)
    return {"packages": names, "sha256": hashlib.sha256(data).hexdigest()}


def _load(site: Path, parts: dict[str, object], cache: Path) -> tuple[list[str], list[str]]:
    """The terminal's lines of a process that loads the embedded model: (stdout's, stderr's), blank ones left out."""
    env = {**os.environ, "EVOLVE_CACHE": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(site), json.dumps(parts)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return [x for x in done.stdout.splitlines() if x.strip()], [x for x in done.stderr.splitlines() if x.strip()]


def test_the_first_run_prepares_the_model_into_a_log_file_and_says_one_line(tmp_path):
    from policies.gguf_export import write_model_gguf
    from policies.tiny import tiny_model
    from tests.test_gguf_tokenizer import _qwen2_shaped_tokenizer

    need_llama()
    folder = tmp_path / "tiny"
    tokenizer = _qwen2_shaped_tokenizer()
    tiny_model(tokenizer, seed=1).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    site = tmp_path / "site"
    parts = _published(site, write_model_gguf(folder, tmp_path / "tiny.gguf"))
    cache = tmp_path / "cache"

    out, err = _load(site, parts, cache)
    log = cache / "build.log"
    assert out == ["loaded 260"], out
    assert err == [f"preparing the embedded model, once (a minute or more); its log: {log}"], "\n".join(err)[-3000:]
    kept = log.read_text()
    assert "llama_model_loader" in kept and "preparing the embedded model" in kept, kept[-2000:]
    assert len(kept.splitlines()) > 30  # the loader's lines, all of them
    assert (cache / "gguf" / "model-q8_0.gguf").is_file()
    assert (cache / "qwen2.5-coder-0.5b-instruct" / ".complete").exists()

    assert _load(site, parts, cache) == (["loaded 260"], [])  # prepared: nothing more to say
