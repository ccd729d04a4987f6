"""No command runs a candidate on a sandbox weaker than it says (issue 22).

`evolve run` refused a split-form problem on the WEAK process sandbox, but `evolve eval` and `evolve check` ran
it, as root: a candidate read the expected answers and the engine's environment. Now all three ask one rule
(sandboxes.backends.weak_sandbox_refusal): refuse in one line naming the cause and the fix, unless
--allow-weak-sandbox. And WEAK never runs a candidate as root: a root engine that cannot hand it another uid
refuses, whatever the flags. WEAK is forced by a PATH without bubblewrap, as a user without it would have.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.problem import load_problem
from sandboxes.process import ProcessSandbox
from sandboxes.sandbox import SandboxRefused
from tests.helpers import write_problem
from tests.services import left_to_the_unprivileged_pass

UID_PROBE = "def solve(x):\n    import os\n    return x * x if os.geteuid() != 0 else -1\n"


def weak_refused_as_root() -> bool:
    """True where this engine, as root, cannot hand a WEAK sandbox's candidates another uid."""
    try:
        ProcessSandbox(slots=1, jail=False).close()
    except SandboxRefused:
        return True
    return False


@pytest.fixture(scope="module")
def problem_dir(tmp_path_factory) -> Path:
    return write_problem(tmp_path_factory.mktemp("weak") / "p", timeout=10)


def evolve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    no_bwrap = tmp_path / "bin"
    no_bwrap.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": str(no_bwrap)}
    command = [sys.executable, "-m", "evolve.cli", *args, "--sandbox", "process"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def one_line(out: subprocess.CompletedProcess) -> str:
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and out.stdout == "", (out.returncode, out.stdout, out.stderr)
    return lines[0]


def test_weak_never_runs_a_candidate_as_root(problem_dir):
    try:
        box = ProcessSandbox(slots=1, jail=False)
    except SandboxRefused as exc:  # as root, refusing is what this test asks for: it runs nothing as root
        assert os.geteuid() == 0, exc
        assert "as root" in str(exc) and "install bubblewrap" in str(exc) and sys.executable in str(exc)
        return
    try:
        assert box.evaluate(load_problem(problem_dir), UID_PROBE).scores == {"c0": 1.0, "c1": 1.0}
    finally:
        box.close()


@pytest.mark.parametrize("command", ["eval", "check"])
def test_a_weak_sandbox_is_refused_for_a_split_problem_unless_allowed(command, problem_dir, tmp_path):
    program = tmp_path / "candidate.py"
    program.write_text("def solve(x):\n    return 4\n")
    args = [command, str(problem_dir)] + ([str(program), "--json"] if command == "eval" else [])
    refused = one_line(evolve(tmp_path, *args))
    if weak_refused_as_root():
        assert "as root" in refused and "install bubblewrap" in refused, refused
        assert "as root" in one_line(evolve(tmp_path, *args, "--allow-weak-sandbox"))
        left_to_the_unprivileged_pass("as root the WEAK sandbox refuses before the split-problem rule is asked")
    assert "WEAK" in refused and "bubblewrap is not installed" in refused, refused
    assert "--allow-weak-sandbox" in refused and "expected answers" in refused, refused
    allowed = evolve(tmp_path, *args, "--allow-weak-sandbox")
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    if command == "eval":
        got = json.loads(allowed.stdout)
        assert got["scores"] == {"c0": 1.0, "c1": 0.0} and "WEAK" in got["isolation"], got
    else:
        assert allowed.stdout.startswith("ok t: split-form evaluator") and "WEAK" in allowed.stdout, allowed.stdout
