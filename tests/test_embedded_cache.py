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
from pathlib import Path

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
    assert _built(target.parent) == ["model.gguf", "model.sha256"]


def _built(folder: Path) -> list[str]:
    """What a build left in the folder, less its lock file."""
    return sorted(p.name for p in folder.iterdir() if p.name != ".build.lock")


def _parts_or_skip() -> None:
    try:
        part_files()
    except Exception as exc:
        pytest.skip(str(exc))


def test_a_join_killed_halfway_leaves_nothing_the_next_one_does_not_take_over(tmp_path):
    """kill -9 mid-join left a staging file of hundreds of MB named for the dead process, which no later build
    removed: on a small disk, the next join then failed for space, and every one after it."""
    _parts_or_skip()
    cache = tmp_path / "cache"
    env = {**os.environ, "EVOLVE_CACHE": str(cache)}
    join = [sys.executable, "-c", "from policies.embedded import embedded_gguf; print(embedded_gguf())"]
    killed = subprocess.Popen(join, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = cache / "gguf"
    for _ in range(2000):
        staged = [p for p in folder.glob("*.partial")] if folder.is_dir() else []
        if staged and staged[0].stat().st_size > 50 << 20:
            break
        time.sleep(0.005)
    killed.kill()
    killed.wait()
    assert staged, "the join never started"
    again = subprocess.run(join, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-800:]
    assert _built(folder) == ["model.gguf", "model.sha256"]


def test_a_join_that_fails_removes_what_it_staged_and_an_unusable_cache_is_one_line(tmp_path, monkeypatch):
    _parts_or_skip()
    import policies.embedded as embedded
    from policies.policy import PolicyError

    monkeypatch.setenv("EVOLVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(embedded, "GGUF_SHA256", "0" * 64)
    with pytest.raises(PolicyError, match="embedded model parts join to sha256"):
        embedded.embedded_gguf()
    assert _built(tmp_path / "cache" / "gguf") == []
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("EVOLVE_CACHE", str(tmp_path / "a-file" / "cache"))
    with pytest.raises(PolicyError) as raised:
        embedded.embedded_gguf()
    assert str(raised.value) == (
        f"{tmp_path / 'a-file' / 'cache' / 'gguf'}: cannot build the embedded model there (Not a directory); "
        "set EVOLVE_CACHE to a folder you may write"
    )


def test_a_process_that_waits_for_another_ones_build_says_so(tmp_path):
    """A build takes minutes (the safetensors conversion); the waiting process had been silent, like a hang."""
    _parts_or_skip()
    from policies.build_lock import building

    cache = tmp_path / "cache"
    env = {**os.environ, "EVOLVE_CACHE": str(cache)}
    join = [sys.executable, "-c", "from policies.embedded import embedded_gguf; print(embedded_gguf())"]
    with building(cache / "gguf", "a test's stand-in"):
        waiting = subprocess.Popen(join, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3.0)
        assert waiting.poll() is None  # still waiting: nothing was built beside the holder
    out, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0 and out.strip() == str(cache / "gguf" / "model.gguf"), err[-800:]
    assert f"waiting for another process that is building the embedded model in {cache / 'gguf'}" in err
