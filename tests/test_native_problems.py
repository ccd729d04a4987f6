"""Problems in other languages: the shipped C and Rust examples score in the sandboxes, a child that does not
build scores kind `build` and its compiler's words reach the next prompt, a C child is parsed and scored like a
Python one, the simple form runs the built program itself, and malformed folders get one clear line."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.archive import ChildFailure
from evolve.cli import app
from evolve.problem import ProblemError, load_problem
from evolve.problem.outcome import ErrorKind
from evolve.problem.scaffold import scaffold
from evolve.prompts import PromptInputs, build_prompt, parse_completion
from sandboxes.process import ProcessSandbox
from sandboxes.toolchain import TOOLCHAIN_INSIDE, host_toolchain
from tests.helpers import docker_sandbox_or_skip
from tests.native import assert_known_c_vectors, c_program, write_c_problem

PROBLEMS = Path(__file__).resolve().parents[1] / "problems"
ROMAN_C = """static void solve(int n, char *out) {
    static const int values[] = {1000, 900, 500, 400, 100, 90, 50, 40, 10, 9, 5, 4, 1};
    static const char *letters[] = {"M", "CM", "D", "CD", "C", "XC", "L", "XL", "X", "IX", "V", "IV", "I"};
    out[0] = '\\0';
    for (int i = 0; i < 13; i++) {
        while (n >= values[i]) {
            strcat(out, letters[i]);
            n -= values[i];
        }
    }
}
"""


def _seed_vector(problem) -> dict[str, float]:
    """What the examples' seeds score: they know only I, V and X, without subtractive forms."""

    def seed(n: int) -> str:
        out = ""
        for value, letter in ((10, "X"), (5, "V"), (1, "I")):
            while n >= value:
                out, n = out + letter, n - value
        return out

    return {c.name: 1.0 if seed(c.input) == c.trusted["expected"] else 0.0 for c in problem.cases}


@pytest.fixture(scope="module")
def process_sandbox():
    box = ProcessSandbox(slots=1)
    yield box
    box.close()


def test_the_c_example_builds_and_a_child_that_does_not_shows_its_log_in_the_next_prompt(process_sandbox):
    problem = load_problem(PROBLEMS / "roman_numerals_c")
    seed = process_sandbox.evaluate(problem, problem.seed_code)
    assert seed.ok and seed.scores == _seed_vector(problem), seed.error
    assert 0 < sum(seed.scores.values()) < len(seed.scores)

    broken = process_sandbox.evaluate(problem, problem.seed_code.replace("out[0] = '\\0';", "out[0] = '\\0'"))
    assert broken.error_kind == ErrorKind.BUILD and set(broken.scores.values()) == {0.0}
    assert "roman.c:" in (broken.error or "") and "error: expected ';'" in (broken.error or ""), broken.error
    prompt = build_prompt(
        PromptInputs(
            problem.config.description,
            problem.seed_code,
            seed.scores,
            None,
            [],
            1,
            "full",
            recent_failures=[ChildFailure("build", broken.error or "")],
        )
    )
    assert "- build: the build failed (exit 1):" in prompt and "error: expected ';'" in prompt
    assert "```c\n/* Only knows I, V and X" in prompt and "one ```c fenced block" in prompt

    # A C child is parsed without Python's syntax check, from a fence tagged c, and then scored in full.
    (child,) = parse_completion(problem.seed_code, f"<variant 1>\n```c\n{ROMAN_C}```\n</variant 1>", 1)
    assert child.status == "ok" and child.code is not None, child.detail
    (bare,) = parse_completion(problem.seed_code, f"<variant 1>\n{ROMAN_C}</variant 1>", 1)  # no fence at all
    assert bare.status == "ok" and bare.code == child.code, bare.detail
    solved = process_sandbox.evaluate(problem, child.code)
    assert solved.ok and set(solved.scores.values()) == {1.0}, solved.error


def test_a_build_time_is_stored_apart_shown_by_show_and_averaged_by_inspect(tmp_path):
    """Each evaluation of a C program keeps the seconds of its build (a failed build too) in evaluations.build_s,
    within its duration; `evolve show` prints it beside the duration and `inspect --json` gives the run's mean."""
    root = write_c_problem(tmp_path / "p")
    (root / "prog.c").write_text(c_program("4"))  # a seed that leaves something to improve
    block = "```c\nstatic long solve(long x) {{ return {}; }}\n```\n"
    replay = tmp_path / "replay.json"
    replay.write_text(
        json.dumps(
            [f"<variant 1>\n{block.format('x *')}</variant 1>\n<variant 2>\n{block.format('x * x')}</variant 2>"]
        )
    )
    db, runner = str(tmp_path / "c.db"), CliRunner()

    def invoke(*args: str) -> str:
        result = runner.invoke(app, list(args), catch_exceptions=False)
        assert result.exit_code == 0, (args, result.output)
        return result.output

    invoke(
        "run", str(root), "--db", db, "--policy", f"replay:{replay}", "--sandbox", "process", "--workers", "1",
        "--group-size", "1", "--variants", "2", "--max-evaluations", "3",
    )  # fmt: skip
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT program_id, error_kind, build_s, duration_s FROM evaluations ORDER BY id").fetchall()
    assert [kind for _, kind, _, _ in rows] == [None, "build", None], rows
    assert all(0 < build_s < duration_s for _, _, build_s, duration_s in rows), rows
    program_id, _, build_s, duration_s = rows[0]
    shown = invoke("show", db, str(program_id))
    assert f"{duration_s * 1000:.0f} ms (build {build_s * 1000:.0f} ms of it) in process" in shown, shown
    (summary,) = json.loads(invoke("inspect", db, "--json"))
    assert summary["telemetry"]["builds"] == 3
    assert summary["telemetry"]["build_s_mean"] == pytest.approx(sum(r[2] for r in rows) / 3)
    assert "builds 3: mean" in invoke("inspect", db)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["process", "docker"])
def test_the_rust_example_builds_in_both_sandboxes(kind):
    problem = load_problem(PROBLEMS / "roman_numerals_rust")
    box = ProcessSandbox(slots=1) if kind == "process" else docker_sandbox_or_skip(workers=1)
    try:
        seed = box.evaluate(problem, problem.seed_code)
        assert seed.ok and seed.scores == _seed_vector(problem), seed.error
        broken = box.evaluate(problem, problem.seed_code.replace("    out\n}", "    n\n}"))
        assert broken.error_kind == ErrorKind.BUILD and "error[E0308]: mismatched types" in (broken.error or "")
    finally:
        box.close()


SIMPLE_EVAL = """
import json, os, subprocess

def evaluate(program_path):
    run = json.loads(os.environ["EVOLVE_RUN_COMMAND"])
    got = [subprocess.run(run, input=f"{x}\\n", capture_output=True, text=True, timeout=5).stdout for x in (2, 3)]
    return {"c0": float(got[0].strip() == "4"), "c1": float(got[1].strip() == "9")}
"""


def test_a_simple_form_evaluator_runs_the_built_program(process_sandbox, tmp_path):
    root = write_c_problem(tmp_path / "simple")
    (root / "evaluate.py").write_text(SIMPLE_EVAL)
    problem = load_problem(root)
    assert problem.form == "simple"
    built = process_sandbox.evaluate(problem, c_program("x * x"))
    assert built.scores == {"c0": 1.0, "c1": 1.0}
    assert built.build_s is not None and 0 < built.build_s < built.duration_s  # the harness timed the build
    assert process_sandbox.evaluate(problem, c_program("4")).scores == {"c0": 1.0, "c1": 0.0}
    bad = process_sandbox.evaluate(problem, c_program("x *"))
    assert bad.error_kind == ErrorKind.BUILD and "error:" in (bad.error or "")


def test_init_scaffolds_each_language_and_the_c_seed_scores(process_sandbox, tmp_path):
    for language in ("python", "c", "rust"):
        scaffold(tmp_path / language, language)
        problem = load_problem(tmp_path / language)
        assert problem.config.native == (language != "python") and problem.form == "split"
    python, c = load_problem(tmp_path / "python"), load_problem(tmp_path / "c")
    want = process_sandbox.evaluate(python, python.seed_code).scores  # the same cases, the same seed
    assert process_sandbox.evaluate(c, c.seed_code).scores == pytest.approx(want, rel=1e-12)


C_BUILD = 'command = ["sh", "-c", "cc -O0 -o prog prog.c && ./prog --build"]'


def _without_run(root: Path) -> None:
    toml = root / "problem.toml"
    toml.write_text(toml.read_text().replace('[run]\ncommand = ["./prog"]', ""))


def _unknown_compiler(root: Path) -> None:
    toml = root / "problem.toml"
    toml.write_text(toml.read_text().replace(C_BUILD, 'command = ["no-such-cc"]'))


def _openevolve_rust(root: Path) -> None:
    (root / "problem.toml").unlink()
    (root / "evaluator.py").write_text("def evaluate(program_path):\n    return {}\n")
    (root / "initial_program.rs").write_text("fn main() {}\n")


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (_without_run, "language = 'c' needs [run] command = [...]"),
        (_unknown_compiler, "[build] command: 'no-such-cc' is not installed here"),
        (_openevolve_rust, "an OpenEvolve folder whose program is initial_program.rs, not Python"),
    ],
)
def test_a_folder_that_cannot_run_gets_one_line(tmp_path, change, said):
    root = write_c_problem(tmp_path / "p")
    change(root)
    with pytest.raises(ProblemError) as raised:
        load_problem(root)
    assert said in str(raised.value) and "\n" not in str(raised.value)


def test_a_toolchain_outside_usr_is_bound_folder_by_folder_and_read_only(tmp_path):
    rustc = shutil.which("rustc")
    if rustc is None or Path(rustc).resolve().name != "rustup":
        pytest.skip("rustc here is not a rustup proxy")  # not a service: Debian's rustc lives under /usr
    tools = host_toolchain(load_problem(PROBLEMS / "roman_numerals_rust"))
    (argv0, *_), binds = tools.argv(["rustc", "x.rs"]), dict(tools.binds)
    toolchain = Path(next(host for host, inside in binds.items() if inside == f"{TOOLCHAIN_INSIDE}/0/bin")).parent
    assert "/toolchains/" in str(toolchain) and argv0 == f"{TOOLCHAIN_INSIDE}/0/bin/rustc"  # not rustup's proxy
    folders = {
        str(entry): f"{TOOLCHAIN_INSIDE}/0/{entry.name}"
        for entry in toolchain.iterdir()
        if entry.is_dir() and entry.name != "etc"  # a prefix's configuration stays out (rustup's: shell completions)
    }
    assert binds == {**folders, "/etc/alternatives": "/etc/alternatives"}


def test_a_tool_whose_folder_holds_the_problem_is_bound_alone(process_sandbox, tmp_path):
    """A build script in ~/bin must not bring the home folder (and the problem's answers) into the sandbox."""
    root = write_c_problem(tmp_path / "p")
    tool = tmp_path / "bin" / "build-c"  # the folder above its bin/ holds the problem
    tool.parent.mkdir()
    tool.write_text('#!/bin/sh\nexec cc -O0 -o prog prog.c "$@"\n')
    tool.chmod(0o755)
    toml = root / "problem.toml"
    toml.write_text(toml.read_text().replace(C_BUILD, f'command = ["{tool}"]'))
    problem = load_problem(root)
    tools = host_toolchain(problem)
    assert dict(tools.binds) == {str(tool): f"{TOOLCHAIN_INSIDE}/0", "/etc/alternatives": "/etc/alternatives"}
    assert process_sandbox.evaluate(problem, c_program("x * x")).scores == {"c0": 1.0, "c1": 1.0}


def test_a_tool_in_a_hidden_folder_of_the_home_is_bound_alone(process_sandbox, tmp_path, monkeypatch):
    """pip --user, pipx and cargo install put tools in ~/.local/bin or ~/.cargo/bin. Taken for a toolchain, the
    folder above bin/ came in whole, and the candidate read ~/.local/share (or ~/.cargo/credentials.toml): it
    answers 9 with the planted file and 4 without."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    tool = home / ".local" / "bin" / "build-c"
    tool.parent.mkdir(parents=True)
    tool.write_text('#!/bin/sh\nexec cc -O0 -o prog prog.c "$@"\n')
    tool.chmod(0o755)
    (home / ".local" / "share").mkdir()
    (home / ".local" / "share" / "evolve-secret").write_text("9\n")
    root = write_c_problem(tmp_path / "p")
    toml = root / "problem.toml"
    toml.write_text(toml.read_text().replace(C_BUILD, f'command = ["{tool}"]'))
    problem = load_problem(root)
    peek = (
        f'static long peek(void) {{ FILE *f = fopen("{TOOLCHAIN_INSIDE}/0/share/evolve-secret", "r"); long v = 4;'
        ' if (f) { if (fscanf(f, "%ld", &v) != 1) v = 0; fclose(f); } return v; }'
    )
    assert process_sandbox.evaluate(problem, c_program("peek()", head=peek)).scores == {"c0": 1.0, "c1": 0.0}
    assert_known_c_vectors(process_sandbox, problem)


@pytest.mark.parametrize("kind", ["process", "docker"])
def test_files_at_the_top_of_a_toolchain_stay_out(process_sandbox, tmp_path, kind):
    """A build started by a Python outside /usr (an engine's pyenv or conda installation, named through a venv's
    `python3`) takes the installation for its toolchain; pip reads `{sys.prefix}/pip.conf`, where such an
    installation keeps an index token. Its folders come in, not the files at its top: the candidate answers 9
    with the planted file and 4 without. In Docker the installation's folders were also the engine's own Python's
    (/opt/python): binds keyed by host path kept only the toolchain's, and no container started its runner."""
    base = Path(sys.base_prefix).resolve()
    python = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    if str(python).startswith("/usr/") or not python.is_relative_to(base) or not os.access(base, os.W_OK):
        pytest.skip("no writable Python installation outside /usr to build with here")
    planted = base / f"evolve-attack-{uuid.uuid4().hex[:8]}.conf"  # pip.conf itself would change the host's pip
    in_etc = base / "etc" / planted.name  # a prefix's etc (an nvm node's etc/npmrc holds its token): out too
    in_envs = base / "envs" / planted.name  # conda's other environments, each with its pip.conf: out too
    made = [folder for folder in (in_etc.parent, in_envs.parent) if not folder.exists()]
    root = write_c_problem(tmp_path / "p")
    build = "import os; os.execvp('cc', ['cc', '-O0', '-o', 'prog', 'prog.c'])"
    toml = root / "problem.toml"
    toml.write_text(toml.read_text().replace(C_BUILD, f"command = {json.dumps([str(python), '-c', build])}"))
    problem = load_problem(root)
    peek = (
        f'static long peek(void) {{ FILE *f = fopen("{TOOLCHAIN_INSIDE}/0/{planted.name}", "r"); long v = 4;'
        f' if (!f) f = fopen("{TOOLCHAIN_INSIDE}/0/etc/{planted.name}", "r");'
        f' if (!f) f = fopen("{TOOLCHAIN_INSIDE}/0/envs/{planted.name}", "r");'
        ' if (f) { if (fscanf(f, "%ld", &v) != 1) v = 0; fclose(f); } return v; }'
    )
    box = process_sandbox if kind == "process" else docker_sandbox_or_skip(workers=1)
    planted.write_text("9\n")
    for secret in (in_etc, in_envs):
        secret.parent.mkdir(exist_ok=True)
        secret.write_text("9\n")
    try:
        got = box.evaluate(problem, c_program("peek()", head=peek))
        assert got.scores == {"c0": 1.0, "c1": 0.0}, (got.error, got.stderr[-300:])
        assert_known_c_vectors(box, problem)
    finally:
        planted.unlink()
        in_etc.unlink()
        in_envs.unlink()
        for folder in made:
            folder.rmdir()
        if box is not process_sandbox:
            box.close()
