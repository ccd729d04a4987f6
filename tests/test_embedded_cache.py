"""The embedded model's cache, built by two processes that start at once on a fresh machine.

The study's two lanes did: both joined the six parts into one `model.partial`, the first renamed it, and the
second failed on its rename (FileNotFoundError) and lost its arm. Now one builds while the other waits.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time

import pytest

from policies.embedded import GGUF_SHA256, part_files

JOIN = """import sys, time
from pathlib import Path
while not Path(sys.argv[1]).exists():
    time.sleep(0.005)
from policies.embedded import embedded_gguf
print(embedded_gguf())
"""


def test_two_processes_joining_the_embedded_model_at_once_both_get_the_checked_file(tmp_path):
    try:
        part_files()
    except Exception as exc:  # the parts are an extra: a machine without them has no embedded model to join
        pytest.skip(str(exc))
    cache, go = tmp_path / "cache", tmp_path / "go"
    env = {**os.environ, "EVOLVE_CACHE": str(cache)}
    procs = [
        subprocess.Popen([sys.executable, "-c", JOIN, str(go)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    time.sleep(2.0)  # both started and waiting
    go.touch()
    results = [(p.wait(timeout=300), p.stdout.read().decode(), p.stderr.read().decode()) for p in procs]
    target = cache / "gguf" / "model.gguf"
    assert [(code, out.strip()) for code, out, _ in results] == [(0, str(target))] * 2, [e[-800:] for *_, e in results]
    digest = hashlib.sha256()
    with open(target, "rb") as f:
        while chunk := f.read(1 << 24):
            digest.update(chunk)
    assert digest.hexdigest() == GGUF_SHA256
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.gguf", "model.sha256"]
