"""Hostile candidates against how each sandbox brings in the engine's Python (sandboxes/jail.py's Runtime, which
the Docker host base image lays out the same way): what comes in with the installation must be its programs and
libraries, never the configuration kept beside them."""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest

from evolve.problem import load_problem
from sandboxes.docker_images import host_spec
from sandboxes.jail import PYTHON_INSIDE, find_jail
from sandboxes.process import ProcessSandbox
from tests.helpers import assert_known_vectors, docker_sandbox_or_skip, reported, write_problem
from tests.services import missing


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(write_problem(tmp_path_factory.mktemp("runtime attacked")))


@pytest.fixture(scope="module")
def planted():
    """Files a token could sit in, planted before the sandboxes work out their binds (which they do as they
    start): one at the top of this engine's Python installation, and one in a pyenv-virtualenv environment
    under its `envs/` (a pip.conf at the top would be the host's own). As root only; the unprivileged pass
    checks what the installation already keeps. None when the installation is under /usr."""
    base = Path(sys.base_prefix).resolve()
    if base.is_relative_to("/usr"):
        yield None
        return
    tag = f"evolve-attack-{uuid.uuid4().hex[:8]}"
    paths = [base / f"{tag}.conf", base / "envs" / tag / "pip.conf"]
    made_envs = not (base / "envs").exists()
    try:
        if os.access(base, os.W_OK):
            paths[1].parent.mkdir(parents=True)
            for path in paths:
                path.write_text("index-url = https://user:token-3391@index.example/simple\n")
        yield [f"{PYTHON_INSIDE}/{path.relative_to(base)}" for path in paths]
    finally:
        shutil.rmtree(paths[1].parent, ignore_errors=True)
        paths[0].unlink(missing_ok=True)
        if made_envs:
            shutil.rmtree(base / "envs", ignore_errors=True)


@pytest.fixture(scope="module", params=["process", "docker"])
def sandbox(request, planted):
    if request.param == "process":
        jail, why = find_jail()
        if jail is None:
            missing("bubblewrap", why)
        box = ProcessSandbox(slots=1)
    else:  # the host base image, which binds this engine's Python (python:3.12-slim, if present, binds none)
        box = docker_sandbox_or_skip(workers=1, image=host_spec())
    assert box.hides_files, box.isolation()
    yield box
    box.close()


def test_files_at_the_top_of_the_python_installation_and_its_other_environments_are_out_of_reach(
    sandbox, problem, planted
):
    """pip reads `{sys.prefix}/pip.conf`, so an installation of one's own (pyenv, conda; `.condarc` too) keeps an
    index URL with its token at its top, and pyenv-virtualenv keeps every virtual environment, each with its own,
    under its `envs/`. Bound whole at /opt/python, all of it was a candidate's to read in both sandboxes; its
    folders but `envs` come in one by one now, and the files beside them stay out."""
    if planted is None:
        pytest.skip("this engine's Python is under /usr: no installation is bound at /opt/python")
    code = (
        "import os\ndef solve(x):\n"
        f"    got = [sorted(e.name for e in os.scandir({PYTHON_INSIDE!r}) if not e.is_dir() or e.name == 'envs')]\n"
        f"    for path in {planted!r}:\n        try:\n            got.append(open(path).read())\n"
        "        except OSError as e:\n            got.append(type(e).__name__)\n    return got\n"
    )
    got = reported(sandbox.evaluate(problem, code))
    assert got == [[], "FileNotFoundError", "FileNotFoundError"], got
    assert_known_vectors(sandbox, problem)
