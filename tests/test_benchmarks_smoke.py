"""Every benchmark of benchmarks/ runs at smoke size, so that none rots unnoticed.

`python -m benchmarks` lists the suite (found by scanning the folder, so a new benchmark is in it at once);
`python -m benchmarks --smoke` runs each with the arguments it declares for a run of seconds. Here, for every
listed benchmark, its section of the smoke run must end `ok` and hold its result line (a line opening with its
name). Both are read from the subprocesses' output only: tests import nothing from benchmarks/.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_benchmarks(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def listed_names() -> list[str]:
    listing = run_benchmarks(timeout=60)
    assert listing.returncode == 0, listing.stderr
    names = re.findall(r"^  (\w+)  ", listing.stdout, flags=re.M)
    assert names, listing.stdout
    return names


def test_the_listing_names_every_benchmark_with_its_kind_and_purpose():
    """Fast: the listing reads the modules' syntax only. Every module that runs as a script is listed, and none
    lacks a kind, its smoke arguments or a purpose (a `!` line names what one lacks)."""
    listing = run_benchmarks(timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert sorted(listed_names()) == scripts()
    assert "undeclared" not in listing.stdout and "\n! " not in listing.stdout, listing.stdout


def test_the_benchmarks_readme_names_every_benchmark():
    """benchmarks/README.md lists the suite as the listing does: a row per benchmark."""
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert [n for n in listed_names() if f"| {n} |" not in readme] == []


def scripts() -> list[str]:
    """The benchmarks as the folder holds them: every module that runs as a script (the listing must agree)."""
    runs_as_script = re.compile(r'^if __name__ == "__main__":', flags=re.M)
    found = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if runs_as_script.search(p.read_text()))
    return [s for s in found if s != "__main__"]


def smoke_selection() -> list[str]:
    """The benchmarks this session smoke-runs: all of them, or BENCHMARKS_SMOKE_ONLY's."""
    only = [n for n in os.environ.get("BENCHMARKS_SMOKE_ONLY", "").split(",") if n]
    unknown = sorted(set(only) - set(scripts()))
    if unknown:
        raise pytest.UsageError(
            f"BENCHMARKS_SMOKE_ONLY names no benchmark: {unknown}; `python -m benchmarks` lists them"
        )
    return only or scripts()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "bench_name" in metafunc.fixturenames:
        metafunc.parametrize("bench_name", smoke_selection())


def test_the_smoke_runs_are_the_suites_benchmarks():
    """The benchmarks smoke-run below (one test each) are exactly those `python -m benchmarks` lists."""
    assert scripts() == sorted(listed_names())


class SmokeShards:
    """The session's chosen benchmarks in two shards, each run by one `python -m benchmarks --smoke` process.

    One process per shard, not per benchmark: most benchmarks import torch and the engine (seconds of CPU, paid
    once per process), while under pytest-xdist the two shards run on the two workers at once. A shard's output is
    kept in a folder the workers share, under a lock: the worker that needs it first runs it (first running any
    shard nobody has started, rather than wait idle), and every other test of the shard reads it."""

    def __init__(self, names: list[str], folder: Path) -> None:
        self.shards = [names[0::2], names[1::2]]
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def output(self, name: str) -> dict:
        mine = next(k for k, shard in enumerate(self.shards) if name in shard)
        self._prepare()
        got = self._run(mine, wait=False)
        if got is None:  # another worker is running this shard: run one nobody has started meanwhile
            for k in [k for k in range(len(self.shards)) if k != mine]:
                self._run(k, wait=False)
            got = self._run(mine, wait=True)
        assert got is not None
        return got

    def _prepare(self) -> None:
        """The tiny model and the study are made once before any shard runs (two processes making them at once
        could read each other's half-written files)."""
        with self._locked("prepare", wait=True):
            done = self.folder / "prepared"
            if not done.exists():
                code = "from benchmarks.smoke_inputs import filled; filled(('{tiny_model}', '{study}'))"
                made = subprocess.run(
                    [sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}
                )
                assert made.returncode == 0, "making the smoke runs' tiny model and study failed"
                done.write_text("")

    def _run(self, k: int, wait: bool) -> dict | None:
        """Shard k's output, run here unless it was already; None when another worker holds it and not `wait`."""
        key = hashlib.sha256(" ".join(self.shards[k]).encode()).hexdigest()[:12]  # a shard is its members
        out = self.folder / f"shard-{key}.json"
        with self._locked(f"shard-{key}", wait) as held:
            if not held:
                return None
            if not out.exists() and self.shards[k]:
                smoke = run_benchmarks("--smoke", *self.shards[k], timeout=900)
                out.write_text(json.dumps({"stdout": smoke.stdout, "stderr": smoke.stderr, "names": self.shards[k]}))
            return json.loads(out.read_text()) if out.exists() else None

    @contextlib.contextmanager
    def _locked(self, what: str, wait: bool) -> Iterator[bool]:
        with open(self.folder / f"{what}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:  # another worker is running it
                yield False
                return
            yield True


@pytest.fixture(scope="session")
def smoke_shards(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SmokeShards:
    names = [
        item.callspec.params["bench_name"]
        for item in request.session.items
        if getattr(item, "originalname", "") == SMOKE_TEST
    ]
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the session's folder, above each worker's own
    return SmokeShards(names, shared / "benchmark-smoke")


SMOKE_TEST = "test_every_benchmark_runs_at_smoke_size_and_prints_its_result_line"


@pytest.mark.slow
def test_every_benchmark_runs_at_smoke_size_and_prints_its_result_line(bench_name: str, smoke_shards: SmokeShards):
    """BENCHMARKS_SMOKE_ONLY=NAME,... runs those alone (to see one benchmark's smoke run through this test), as
    does `-k NAME`."""
    smoke = smoke_shards.output(bench_name)
    out, err, name = smoke["stdout"], smoke["stderr"], bench_name
    assert re.search(rf"^smoke ran={len(smoke['names'])} failed=\d+ ", out, flags=re.M), (
        f"the smoke run ended early\n{out[-3000:]}\n{err[-3000:]}"
    )
    section = re.search(rf"^== {name}: .*?^== {name} (ok|failed.*?) in [\d.]+ s$", out, flags=re.M | re.S)
    assert section, f"{name}: no section in the smoke run\n{out[-3000:]}\n{err[-3000:]}"
    body = section.group(0)
    tail = body[-4000:] + err[-4000:]
    assert section.group(1) == "ok", f"{name}: {section.group(1)}\n{tail}"
    result = re.search(rf"^{name} .*\S=\S", body, flags=re.M)  # its name, then figures that hold key=value
    assert result, f"{name}: no result line `{name} ... key=value ...`\n{tail}"
