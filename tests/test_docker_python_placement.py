"""Docker: wherever the host's Python lives, the container runs it read-only at /opt/python, never in scratch.

The base image binds the host's Python installation into the container. Under /work, /tmp or /dev/shm (a
checkout's virtual environment, a temporary one) or a home folder, binding it at its own path would put it
under a scratch mount (shadowed, or walked by the runner's wipe after every job) or out of the container's
reach; it is bound at /opt/python instead, and the container's interpreter is the host's own, same release.
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from evolve.problem import load_problem
from sandboxes.docker_images import HOST_BASE, PYTHON_INSIDE, ImageSpec, build_base, python_binds
from tests.helpers import docker_sandbox_or_skip, host_binds_seen_from_venv, write_problem

SCRATCH = ("/work", "/tmp", "/dev/shm", "/dev/mqueue")  # the container's scratch mounts, wiped after every job
REPO = Path(__file__).resolve().parents[1]
KNOWN = [
    ("def solve(x):\n    return x * x\n", {"c0": 1.0, "c1": 1.0}),
    ("def solve(x):\n    return 4\n", {"c0": 1.0, "c1": 0.0}),
    ("def solve(x):\n    return 9\n", {"c0": 0.0, "c1": 1.0}),
]


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


@pytest.mark.parametrize(
    "prefix", ["/work/checkout/.venv-base", "/tmp/py", "/dev/shm/py", "/home/someone/.pyenv/versions/3.12.1"]
)
def test_an_installation_anywhere_is_bound_outside_every_scratch_mount(prefix):
    python, binds = python_binds(Path(prefix) / "bin" / "python3.12", Path(prefix))
    assert python == f"{PYTHON_INSIDE}/bin/python3.12"
    assert binds == {prefix: PYTHON_INSIDE}
    assert not any(_under(PYTHON_INSIDE, top) or _under(top, PYTHON_INSIDE) for top in SCRATCH)


def test_a_python_under_usr_comes_in_with_usr():
    assert python_binds(Path("/usr/bin/python3.11"), Path("/usr")) == ("/usr/bin/python3.11", {})


# What the candidate's interpreter is, and what the scratch folders hold while it runs.
PROBE = """import os, sys
def solve(x):
    return [sys.executable, sys.version, {host!r} in sys.prefix or os.path.exists({host!r}),
            {{top: sorted(os.listdir(top)) for top in ('/work', '/tmp', '/dev/shm')}}]
"""


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("copies", [False, True], ids=["symlinks", "copies"])
@pytest.mark.parametrize("where", ["/work", "/tmp", "/dev/shm", "home"])
def test_a_virtual_environment_anywhere_runs_the_host_python_in_docker(where, copies, tmp_path):
    """The engine run from a virtual environment made under each place (symlinked or copied interpreter)."""
    parent = Path.home() if where == "home" else Path(where)
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        pytest.skip(f"{parent} is not a folder this user may write: no virtual environment can be made there")
    root = Path(tempfile.mkdtemp(prefix=".evolve-venv-", dir=parent))
    box = None
    try:
        python, binds = host_binds_seen_from_venv(root / "venv", copies)
        assert python.startswith(f"{PYTHON_INSIDE}/") or python.startswith("/usr/"), python
        assert all(not _under(inside, top) for inside in binds.values() for top in SCRATCH), binds
        box = docker_sandbox_or_skip(workers=1, image=ImageSpec(HOST_BASE, python, binds))
        if not box.client.images.list(name=HOST_BASE):
            build_base(box.client)  # the image's root; its own binds are replaced by these
        problem = load_problem(write_problem(tmp_path / "p"))
        outcome = box.evaluate(problem, PROBE.format(host=str(root)))
        assert outcome.feedback, (outcome.error, outcome.stderr[-500:])
        got = outcome.feedback.splitlines()[0]
        assert got.startswith("c0: "), got
        executable, version, host_path_seen, scratch = ast.literal_eval(got[4:])
        assert (executable, version, host_path_seen) == (python, sys.version, False)
        assert scratch == {"/work": ["seed.py"], "/tmp": [], "/dev/shm": []}
        for _ in range(2):
            assert [box.evaluate(problem, code).scores for code, _ in KNOWN] == [want for _, want in KNOWN]
    finally:
        if box is not None:
            box.close()
        shutil.rmtree(root, ignore_errors=True)
