"""Problem folders: the examples pass `evolve check`; malformed ones fail with one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.problem import ProblemError, find_blocks, load_problem, replace_blocks
from tests.helpers import GOOD_SEED, SPLIT_EVAL, SPLIT_TOML, write_problem

ROOT = Path(__file__).resolve().parents[1]
EVOLVE = [sys.executable, "-m", "evolve.cli"]


def evolve(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLVE, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.mark.parametrize("name", ["circle_packing", "roman_numerals", "bin_packing"])
def test_examples_pass_check(name):
    out = evolve("check", str(ROOT / "problems" / name), "--sandbox", "process")
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout and "scalar view" in out.stdout


def test_init_makes_a_folder_that_check_accepts(tmp_path):
    folder = tmp_path / "fresh"
    assert evolve("init", str(folder)).returncode == 0
    out = evolve("check", str(folder), "--sandbox", "process")
    assert out.returncode == 0, out.stderr
    again = evolve("init", str(folder))
    assert again.returncode == 2 and "not empty" in again.stderr


def test_eval_json_reports_vector_scalar_and_isolation(tmp_path):
    folder = write_problem(tmp_path / "p")
    prog = tmp_path / "cand.py"
    prog.write_text("def solve(x):\n    return 4\n")
    out = evolve("eval", str(folder), str(prog), "--sandbox", "process", "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["scores"] == {"c0": 1.0, "c1": 0.0}
    assert data["scalar"] == 0.5 and data["error_kind"] is None and data["sandbox"] == "process"
    assert "process sandbox" in data["isolation"]


SIMPLE_TOML = SPLIT_TOML.replace('entry_point = "solve"', "")


def _simple(tmp_path: Path, body: str) -> Path:
    return write_problem(
        tmp_path / "p",
        toml=SIMPLE_TOML.format(name="s", timeout=3),
        evaluate=f"def evaluate(program_path):\n    {body}\n",
    )


MALFORMED = {
    "missing toml": (lambda d: (d / "problem.toml").unlink(), "problem.toml"),
    "bad toml": (lambda d: (d / "problem.toml").write_text("name = [unclosed"), "invalid TOML"),
    "unknown key": (
        lambda d: (d / "problem.toml").write_text((d / "problem.toml").read_text() + "\nbogus_key = 1\n"),
        "bogus_key",
    ),
    "missing seed": (lambda d: (d / "seed.py").unlink(), "seed.py"),
    "unbalanced blocks": (
        lambda d: (d / "seed.py").write_text("# EVOLVE-BLOCK-START\nx = 1\n"),
        "never closed",
    ),
    "evaluator syntax": (lambda d: (d / "evaluate.py").write_text("def cases(:\n"), "syntax error"),
    "cases raise": (
        lambda d: (d / "evaluate.py").write_text(
            "def cases():\n    raise RuntimeError('boom')\ndef score(c, o):\n    return 0\n"
        ),
        "boom",
    ),
    "case names differ": (
        lambda d: (d / "evaluate.py").write_text(SPLIT_EVAL.replace('"c1"', '"zz"')),
        "components",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_folder_gives_one_line_and_exit_2(tmp_path, case):
    folder = write_problem(tmp_path / "p")
    breaker, needle = MALFORMED[case]
    breaker(folder)
    before = sorted(p.name for p in folder.iterdir())
    out = evolve("check", str(folder), "--sandbox", "process")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert needle in lines[0] and str(folder) in lines[0]
    assert sorted(p.name for p in folder.iterdir()) == before  # wrote nothing


@pytest.mark.parametrize(
    "body,needle",
    [
        ("raise ValueError('evaluator broke')", "evaluator broke"),
        ("return {'c0': 1.0}", "wrong names"),
        ("return {'c0': float('nan'), 'c1': 1.0}", "non-finite"),
        ("return {'c0': float('inf'), 'c1': 1.0}", "non-finite"),
        ("return [1.0, 2.0]", "not a dict"),
    ],
)
def test_broken_simple_evaluator_fails_check(tmp_path, body, needle):
    folder = _simple(tmp_path, body)
    out = evolve("check", str(folder), "--sandbox", "process")
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr


def test_simple_form_scores_and_feedback(tmp_path):
    folder = _simple(tmp_path, "return {'c0': 0.25, 'c1': 0.75}, 'looks fine'")
    problem = load_problem(folder)
    assert problem.form == "simple"
    out = evolve("check", str(folder), "--sandbox", "process")
    assert out.returncode == 0, out.stderr
    assert "0.25" in out.stdout and "0.75" in out.stdout


def test_eval_of_missing_program_file(tmp_path):
    folder = write_problem(tmp_path / "p")
    out = evolve("eval", str(folder), str(tmp_path / "nope.py"))
    assert out.returncode == 2 and "no such program file" in out.stderr


def test_trusted_score_never_crashes_on_nan_or_garbage(tmp_path):
    folder = write_problem(
        tmp_path / "p",
        evaluate=SPLIT_EVAL.replace(
            'return (1.0 if output == case["expected"] else 0.0), repr(output)[:2000]', "return float(output)"
        ),
    )
    problem = load_problem(folder)
    assert problem.score_case(problem.cases[0], float("nan")) == (0.0, "score() returned nan", False)
    value, note, ok = problem.score_case(problem.cases[0], "garbage")
    assert value == 0.0 and not ok
    # the line of evaluate.py that raised: `return float(output)` is its sixth
    assert note == "score() raised ValueError at evaluate.py line 6: could not convert string to float: 'garbage'"


def test_blocks_roundtrip_keeps_outside_text():
    code = (
        "import x\n# EVOLVE-BLOCK-START\na = 1\n# EVOLVE-BLOCK-END\ny = 2\n# EVOLVE-BLOCK-START\nb = 2\n"
        "# EVOLVE-BLOCK-END\n"
    )
    blocks = find_blocks(code)
    assert [b.text for b in blocks] == ["a = 1\n", "b = 2\n"]
    new = replace_blocks(code, ["a = 10", "b = 20\n"])
    assert new == code.replace("a = 1\n", "a = 10\n").replace("b = 2\n", "b = 20\n")
    assert find_blocks("no markers")[0].text == "no markers"


def test_missing_folder_raises_problem_error(tmp_path):
    with pytest.raises(ProblemError, match="not a directory") as err:
        load_problem(tmp_path / "absent")
    assert str(tmp_path / "absent") in str(err.value)
    folder = write_problem(tmp_path / "p")
    assert load_problem(folder).seed_code == GOOD_SEED  # the folder loads with everything in place
    (folder / "problem.toml").unlink()
    with pytest.raises(ProblemError, match="missing") as err:
        load_problem(folder)
    assert str(folder / "problem.toml") in str(err.value)


def test_a_score_given_as_text_is_a_failed_case_and_check_warns_of_cases_that_failed(tmp_path):
    """A `score()` that returns the number as text ("1.0", most likely an output passed on unjudged) fails its
    case as "n/a" does; True counts 1. `evolve check` still passes a seed whose other cases score, but says which
    failed: their fail values in the vector read like honest zeros."""
    evaluate = SPLIT_EVAL.replace(
        'return (1.0 if output == case["expected"] else 0.0), repr(output)[:2000]',
        'return "1.0" if case["name"] == "c0" else output == case["expected"]',
    )
    folder = write_problem(tmp_path / "p", evaluate=evaluate)
    problem = load_problem(folder)
    assert problem.score_case(problem.cases[0], 4) == (0.0, "score() returned str, not a number", False)
    assert problem.score_case(problem.cases[1], 9) == (1.0, None, True)
    out = evolve("check", str(folder), "--sandbox", "process", "--allow-weak-sandbox")
    assert out.returncode == 0, out.stderr
    assert "warning: 1 of 2 cases of the seed failed" in out.stdout
    assert "first: c0: score() returned str, not a number" in out.stdout
    good = evolve("check", str(write_problem(tmp_path / "q")), "--sandbox", "process", "--allow-weak-sandbox")
    assert good.returncode == 0 and "warning" not in good.stdout


def test_a_setting_the_format_does_not_know_names_the_format_page_where_it_can_be_opened(tmp_path, monkeypatch):
    """From any folder: the page's absolute path where the engine runs from a checkout, the repository's page
    where it was installed from a wheel (which carries no docs). It had been `see docs/problem-format.md`,
    relative to a checkout the user may not be in."""
    import evolve.problem.errors as errors

    folder = write_problem(tmp_path / "p")
    (folder / "problem.toml").write_text((folder / "problem.toml").read_text() + "\nbogus_key = 1\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ProblemError) as raised:
        load_problem(folder)
    page = Path(__file__).resolve().parents[1] / "docs" / "problem-format.md"
    assert page.is_file() and str(raised.value).endswith(f"; see {page}")
    monkeypatch.setattr(errors, "DOCS", tmp_path / "no-docs-here")
    with pytest.raises(ProblemError) as raised:
        load_problem(folder)
    assert str(raised.value).endswith("; see docs/problem-format.md in the vpo-evolve repository")


def test_a_run_whose_seed_fails_stops_at_once_saying_why_whatever_its_group_budget(tmp_path):
    """A failed seed leaves no program to be a parent: the run stopped after five groups had failed to pick one,
    and under a group budget of three it said "group budget reached" and exited 0, with nothing done."""
    from typer.testing import CliRunner

    from evolve.cli import app
    from tests.helpers import hiding_sandbox

    hiding_sandbox("process", 1).close()  # a skip (a failure in CI) without bubblewrap
    crashing = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return undefined_name\n# EVOLVE-BLOCK-END\n"
    folder = write_problem(tmp_path / "p", seed=crashing)
    replay = tmp_path / "replay.json"
    replay.write_text('["<variant 1>\\n```python\\ndef solve(x):\\n    return x * x\\n```\\n</variant 1>\\n"]')
    args = ["run", str(folder), "--db", str(tmp_path / "a.db"), "--policy", f"replay:{replay}"]
    ran = CliRunner().invoke(app, [*args, "--sandbox", "process", "--max-groups", "3"])
    assert ran.exit_code == 1, ran.stdout
    assert (
        "stopped: the seed failed its evaluation (crash: every case failed; first: NameError: name 'undefined_name' "
        "is not defined); fix the seed or its evaluator (`evolve check PROBLEM` scores the seed alone)"
    ) in " ".join(ran.stdout.split())
    assert ", 0 groups," in ran.stdout
