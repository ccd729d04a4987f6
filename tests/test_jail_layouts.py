"""The process sandbox's jail holds wherever the interpreter lives (issue 22).

A `.venv` inside a checkout under /work vanished under the jail's /work scratch (bubblewrap: "execvp
.../.venv/bin/python3: No such file or directory"), one under /tmp under its private /tmp, and the sandbox fell
back to WEAK, which `evolve eval` then used as root. Each layout here is a real virtual environment; with its
python the sandbox must say it hides files, score known programs to their exact vectors, and show the candidate
the runtime read-only at the jail's own paths and nothing of the host's. CI runs this file as root and, through
scripts/test-as-user.sh, as an unprivileged user.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from sandboxes.jail import find_jail, jail_runtime
from tests.helpers import write_problem
from tests.layouts import LAYOUTS, env_for, layout_venv
from tests.services import missing

KNOWN = [
    ("def solve(x):\n    return x * x\n", {"c0": 1.0, "c1": 1.0}),
    ("def solve(x):\n    return 4\n", {"c0": 1.0, "c1": 0.0}),
    ("def solve(x):\n    return 9\n", {"c0": 0.0, "c1": 1.0}),
    ("def solve(x):\n    return -1\n", {"c0": 0.0, "c1": 0.0}),
]
# Inside the jail: the runtime at /opt, read-only, and the jail's root too; /work holds the job's files only;
# /tmp is empty; no host path of the environment is there. All true: 4 for both cases, {"c0": 1.0, "c1": 0.0};
# anything else: -1.
LOOK_AROUND = """import os, sys
def _writable(folder):
    try:
        with open(folder + "/evolve-write-test", "w"):
            return True
    except OSError:
        return False
def solve(x):
    seen = (sys.prefix, sys.executable, sorted(os.listdir("/work")), os.listdir("/tmp"),
            os.path.exists(HOST_VENV), os.path.exists(os.path.dirname(HOST_VENV)),
            [_writable(f) for f in (sys.prefix, sys.prefix + "/lib", "/", "/opt", "/work", "/tmp")])
    want = ("/opt/venv", "/opt/venv/bin/python3", ["_evolve_harness.py", "seed.py"], [], False, False,
            [False, False, False, False, True, True])
    return 4 if seen == want else -1
"""
EVAL_FLAGS = ("--sandbox", "process", "--json")
SCRIPT = """import json, sys
from evolve.problem import load_problem
from sandboxes.process import ProcessSandbox
problem = load_problem(sys.argv[1])
programs = json.loads(sys.argv[2])
box = ProcessSandbox(slots=1)
try:
    print(json.dumps({"hides": box.hides_files, "isolation": box.isolation(),
                      "vectors": [box.evaluate(problem, code).scores for code in programs]}))
finally:
    box.close()
"""


@pytest.fixture(scope="module", params=LAYOUTS)
def venv_python(request) -> Iterator[Path]:
    if find_jail()[0] is None:
        missing("bubblewrap", find_jail()[1])
    with layout_venv(request.param) as python:
        yield python


@pytest.fixture(scope="module")
def problem_dir(tmp_path_factory) -> Path:
    return write_problem(tmp_path_factory.mktemp("layout") / "p", timeout=10)


@pytest.mark.slow  # a virtual environment and evolve subprocesses
def test_the_jail_holds_wherever_the_interpreter_lives(venv_python, problem_dir):
    look = LOOK_AROUND.replace("HOST_VENV", repr(str(venv_python.parent.parent)))
    programs = [look] + [code for code, _ in KNOWN]
    out = subprocess.run(
        [str(venv_python), "-c", SCRIPT, str(problem_dir), json.dumps(programs)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env_for(venv_python),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["hides"] and "WEAK" not in got["isolation"], got["isolation"]
    assert got["vectors"] == [{"c0": 1.0, "c1": 0.0}] + [want for _, want in KNOWN]


@pytest.mark.slow  # a virtual environment and evolve subprocesses
def test_evolve_eval_runs_jailed_with_that_interpreter(venv_python, problem_dir, tmp_path):
    """The command as a user runs it: one program whose vector is its own (the test above scores them all)."""
    code, want = KNOWN[2]
    program = tmp_path / "candidate.py"
    program.write_text(code)
    out = subprocess.run(
        [str(venv_python), "-m", "evolve.cli", "eval", str(problem_dir), str(program), *EVAL_FLAGS],
        capture_output=True,
        text=True,
        timeout=240,
        env=env_for(venv_python),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert "WEAK" not in got["isolation"] and got["scores"] == want, got


def test_a_failed_probe_names_its_true_cause():
    """bubblewrap's own words, not a guess about user namespaces (which the old message always made)."""
    if find_jail()[0] is None:
        missing("bubblewrap", find_jail()[1])
    jail, why = find_jail(replace(jail_runtime(), executable="/opt/python/bin/no-such-python"))
    assert jail is None and "execvp /opt/python/bin/no-such-python: No such file or directory" in why, why
    assert "namespace" not in why and why.count("\n") == 0, why
