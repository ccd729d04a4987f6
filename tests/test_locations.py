"""Where the user keeps things is theirs to choose: folders with spaces, relative paths, commands given from
another working directory. A run must read the same files whichever folder a later command starts in."""

from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.cli import app
from evolve.problem import load_problem
from policies.from_spec import anchored_spec
from sandboxes.docker_images import host_spec
from sandboxes.jail import Runtime, find_jail
from tests.helpers import SPLIT_TOML, assert_known_vectors, docker_sandbox_or_skip, write_problem
from tests.services import missing

REPO = Path(__file__).resolve().parents[1]

FULL = "<variant 1>\n```python\ndef solve(x):\n    return {a}\n```\n</variant 1>\n"


def test_specs_naming_a_local_file_are_anchored_and_others_are_kept(tmp_path):
    (tmp_path / "model dir").mkdir()
    assert anchored_spec("replay:runs/r.json", tmp_path) == f"replay:{tmp_path}/runs/r.json"
    assert anchored_spec("llama:../m.gguf", tmp_path / "x") == f"llama:{tmp_path}/m.gguf"
    assert anchored_spec("transformers:model dir", tmp_path) == f"transformers:{tmp_path}/model dir"
    for kept in ("embedded", "llama:embedded", "transformers:Qwen/Qwen2.5-Coder-0.5B-Instruct", "replay:/abs.json",
                 "vllm:http://gpu:8000@m", "openai:http://h/v1@m", "vllm-local:Qwen/Q"):  # fmt: skip
        assert anchored_spec(kept, tmp_path) == kept


def test_init_names_a_spaced_folder_as_one_word_of_the_next_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["init", "odd place/my [b]problem"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert shlex.split(result.output.partition("next: ")[2]) == ["evolve", "check", "odd place/my [b]problem"]


def test_a_run_given_relative_paths_under_a_spaced_folder_resumes_from_another_folder(tmp_path, monkeypatch):
    home = tmp_path / "odd place"
    write_problem(home / "my problem", name="spaced")
    (home / "replay x.json").write_text(json.dumps([FULL.format(a=e) for e in ("x * x + 0", "x ** 2", "x + x")]))
    runner = CliRunner()

    def invoke(*args: str) -> str:
        result = runner.invoke(app, list(args), catch_exceptions=False)
        assert result.exit_code == 0, (args, result.output)
        return result.output

    monkeypatch.chdir(home)
    out = invoke(
        "run", "my problem", "--db", "runs x/a.db", "--policy", "replay:replay x.json", "--sandbox", "process",
        "--workers", "1", "--group-size", "2", "--variants", "1", "--edit-format", "full", "--max-evaluations", "2",
        "--no-stop-when-solved",
    )  # fmt: skip
    assert "evaluation budget reached" in out, out
    hint = next(line for line in out.splitlines() if line.startswith("see it with:"))
    # the printed command can be pasted into a shell as it is
    assert shlex.split(hint)[3:6] == ["evolve", "best", "runs x/a.db"], hint

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    db = home / "runs x" / "a.db"
    out = invoke("resume", str(db), "--max-evaluations", "4")
    assert "evaluation budget reached" in out, out
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == 4
    assert not (elsewhere / "runs").exists()
    stored = str(sqlite3.connect(db).execute("SELECT * FROM runs").fetchone())
    assert "replay:replay x.json" not in stored and f"replay:{home}/replay x.json" in stored  # spec and name


def test_a_replay_file_named_in_problem_toml_is_the_problem_folder_s(tmp_path, monkeypatch):
    """Like its seed, a `[[search.policies]]` spec's relative file is found in the problem folder, wherever the
    run is started from; it was looked up in the working directory."""
    toml = SPLIT_TOML.format(name="tabled", timeout=3.0) + '[[search.policies]]\nspec = "replay:replay_x.json"\n'
    folder = write_problem(tmp_path / "odd place" / "my problem", toml=toml)
    (folder / "replay_x.json").write_text(json.dumps([FULL.format(a="x * x + 0")]))
    monkeypatch.chdir(tmp_path)
    args = [
        "run",
        str(folder),
        "--db",
        "a.db",
        "--sandbox",
        "process",
        "--workers",
        "1",
        "--group-size",
        "1",
        "--variants",
        "1",
        "--edit-format",
        "full",
        "--max-evaluations",
        "2",
        "--no-stop-when-solved",
        "--stall-groups",
        "1000",
    ]  # fmt: skip  (the replay repeats: 6 duplicate groups could stall it first)
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0 and "evaluation budget reached" in result.output, result.output
    stored = str(sqlite3.connect(tmp_path / "a.db").execute("SELECT * FROM runs").fetchone())
    assert f"replay:{folder}/replay_x.json" in stored


# Inside either sandbox a candidate of an engine run from a virtual environment sees that environment (its
# packages) over the engine's base installation: 9 when it does, 4 when not, an import error without the package.
MARKER = """import sys
ANSWER = 9 if (sys.prefix, sys.base_prefix) == ("/opt/venv", BASE) else 4
"""


@pytest.fixture(scope="module", params=["symlinks", "copies"])
def venv_runtime(request, tmp_path_factory) -> Runtime:
    """The jail's runtime as an engine run from a fresh virtual environment (not --system-site-packages) sees
    it, the interpreter symlinked or copied; the environment holds a package of its own."""
    venv = tmp_path_factory.mktemp("venvs") / "env x"
    copies = ["--copies"] if request.param == "copies" else []
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", *copies, str(venv)], check=True, timeout=120)
    base = str(Path(sys.base_prefix).resolve())
    site = next((venv / "lib").glob("python3*/site-packages"))
    inside = base if base.startswith("/usr/") else "/opt/python"
    (site / "evolve_venv_marker.py").write_text(MARKER.replace("BASE", repr(inside)))
    probe = "import dataclasses as d, json, sandboxes.jail as j; print(json.dumps(d.asdict(j.jail_runtime())))"
    seen = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, timeout=120, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    raw = json.loads(seen.stdout)
    return Runtime(**{k: tuple(map(tuple, v)) if k in ("binds", "links") else v for k, v in raw.items()})


def test_the_jail_takes_a_virtual_environment_made_either_way(venv_runtime):
    """Its probe asserts that the jail's interpreter runs as the environment rebuilt at /opt/venv. A copied
    interpreter was taken for the installation: it ran without its standard library and the sandbox was WEAK."""
    if find_jail()[0] is None:
        missing("bubblewrap", find_jail()[1])
    jail, why = find_jail(venv_runtime)
    assert jail is not None, why


@pytest.mark.docker
def test_the_docker_sandbox_imports_a_virtual_environment_s_own_packages(venv_runtime, tmp_path):
    """An engine run from a virtual environment lets its candidates import that environment's packages in Docker,
    as the process sandbox does; before, the container ran the base installation, where they are missing (and
    the base's own packages were importable instead)."""
    box = docker_sandbox_or_skip(workers=1, image=host_spec(venv_runtime))
    try:
        problem = load_problem(write_problem(tmp_path / "my problem"))
        uses_marker = "import evolve_venv_marker\ndef solve(x):\n    return evolve_venv_marker.ANSWER\n"
        outcome = box.evaluate(problem, uses_marker)
        assert outcome.scores == {"c0": 0.0, "c1": 1.0}, (outcome.error, outcome.feedback, outcome.stderr[-300:])
        assert_known_vectors(box, problem)
    finally:
        box.close()


@pytest.mark.docker
def test_the_docker_sandbox_binds_a_problem_folder_whose_path_holds_a_colon_and_a_space(tmp_path):
    """Docker parsed a bind given as a volume, HOST:CONTAINER:MODE, and refused `.../a:b c/data:/data:ro`: every
    evaluation of such a problem crashed. Its data/ must reach the candidate like any other folder's."""
    folder = write_problem(tmp_path / "a:b c" / "my problem")
    (folder / "data").mkdir()
    (folder / "data" / "k").write_text("9\n")
    reads_data = "import os\ndef solve(x):\n    return int(open(os.environ['EVOLVE_DATA_DIR'] + '/k').read())\n"
    box = docker_sandbox_or_skip(workers=1)
    try:
        problem = load_problem(folder)
        outcome = box.evaluate(problem, reads_data)
        assert outcome.scores == {"c0": 0.0, "c1": 1.0}, (outcome.error, outcome.feedback, outcome.stderr[-300:])
        assert_known_vectors(box, problem)
    finally:
        box.close()


@pytest.mark.docker
def test_a_problem_named_after_a_spaced_folder_builds_its_own_docker_image(tmp_path):
    """`evolve init "my problem"` names the problem after its folder. With a Dockerfile its image was tagged
    `vpo-evolve/problem-my problem: v2:…`, which Docker refused, so no evaluation of it could start."""
    import docker

    from sandboxes.docker_images import HOST_BASE, build_base, image_for
    from sandboxes.docker_pool import docker_available

    if (why := docker_available()) is not None:
        missing("Docker", why)
    client = docker.from_env()
    if not client.images.list(name=HOST_BASE):
        build_base(client)
    folder = write_problem(tmp_path / "my problem")
    toml = (folder / "problem.toml").read_text()
    (folder / "problem.toml").write_text(re.sub(r'^name = ".*"$', 'name = "My_Problem.V2"', toml, flags=re.M))
    (folder / "Dockerfile").write_text(f"FROM {HOST_BASE}\nLABEL purpose=test\n")  # no pull: this machine's base
    spec = image_for(client, load_problem(folder))
    try:
        assert spec.tag.startswith("vpo-evolve/problem-my-problem-v2-"), spec.tag
        assert client.images.get(spec.tag).tags == [spec.tag]
    finally:
        client.images.remove(spec.tag, noprune=True)


@pytest.mark.docker
def test_a_python_path_with_a_quote_a_newline_or_a_comma_builds_the_base_image_and_reads_back(monkeypatch):
    """The base image records the Python it was built for in a Dockerfile LABEL. A `"` or a newline in that
    path ended the label's string, so `evolve sandbox build-base` failed; a `,` or `=` split a bind when read."""
    import docker

    from sandboxes import docker_images
    from sandboxes.docker_pool import docker_available

    if (why := docker_available()) is not None:
        missing("Docker", why)
    odd = '/home/o"brien\nx/py, a=b/bin/python3'
    binds = {'/home/o"brien\nx/py, a=b': "/opt/python", "/usr": "/usr"}
    monkeypatch.setattr(docker_images, "host_binds", lambda: (odd, binds))
    monkeypatch.setattr(docker_images, "HOST_BASE", "vpo-evolve/test-odd-labels:1")
    client = docker.from_env()
    docker_images.build_base(client)
    try:
        spec = docker_images.spec_of(client, "vpo-evolve/test-odd-labels:1")
        assert (spec.python, spec.binds) == (odd, binds)
    finally:
        client.images.remove("vpo-evolve/test-odd-labels:1", noprune=True)
