"""Every benchmark of benchmarks/ runs at smoke size, so that none rots unnoticed.

`python -m benchmarks` lists the suite (found by scanning the folder, so a new benchmark is in it at once);
`python -m benchmarks --smoke` runs each with the arguments it declares for a run of seconds. Here, for every
listed benchmark, its section of the smoke run must end `ok` and hold its result line (a line opening with its
name). Both are read from the subprocesses' output only: tests import nothing from benchmarks/.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
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
    runs_as_script = re.compile(r'^if __name__ == "__main__":', flags=re.M)
    scripts = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if runs_as_script.search(p.read_text()))
    scripts = [s for s in scripts if s != "__main__"]
    assert sorted(listed_names()) == scripts
    assert "undeclared" not in listing.stdout and "\n! " not in listing.stdout, listing.stdout


def test_the_benchmarks_readme_names_every_benchmark():
    """benchmarks/README.md lists the suite as the listing does: a row per benchmark."""
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    assert [n for n in listed_names() if f"| {n} |" not in readme] == []


@pytest.mark.slow
def test_every_benchmark_runs_at_smoke_size_and_prints_its_result_line():
    """BENCHMARKS_SMOKE_ONLY=NAME,... runs those alone (to see one benchmark's smoke run through this test)."""
    names = listed_names()
    only = [n for n in os.environ.get("BENCHMARKS_SMOKE_ONLY", "").split(",") if n]
    if only:
        assert set(only) <= set(names), f"BENCHMARKS_SMOKE_ONLY names no benchmark: {sorted(set(only) - set(names))}"
        names = only
    smoke = run_benchmarks("--smoke", *only, timeout=900)
    out = smoke.stdout
    for name in names:
        section = re.search(rf"^== {name}: .*?^== {name} (ok|failed.*?) in [\d.]+ s$", out, flags=re.M | re.S)
        assert section, f"{name}: no section in the smoke run\n{out[-3000:]}\n{smoke.stderr[-3000:]}"
        body = section.group(0)
        tail = body[-4000:] + smoke.stderr[-4000:]
        assert section.group(1) == "ok", f"{name}: {section.group(1)}\n{tail}"
        result = re.search(rf"^{name} .*\S=\S", body, flags=re.M)  # its name, then figures that hold key=value
        assert result, f"{name}: no result line `{name} ... key=value ...`\n{tail}"
    assert smoke.returncode == 0, out[-2000:]
