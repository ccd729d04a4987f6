"""Errors the evaluator swallowed (issue #59): an exception the candidate's own code raises into the evaluator's
(an OpenEvolve-style `try: ... except Exception: score = 0`) is recorded by the sandbox, stored with the
evaluation, shown by `evolve show` and in the next prompt built from that program; in the process and the Docker
sandbox, in both evaluator forms. What the candidate catches itself is not recorded, and no candidate can flood,
forge or break the record (tests/test_swallowed_errors_attacks.py).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.archive import Archive
from evolve.cli import app
from evolve.problem import load_problem
from tests.helpers import KNOWN, hiding_sandbox, write_problem
from tests.swallowed_cases import (
    BROKEN,
    EXACT,
    HALF_BROKEN,
    NAME_ERROR_LINE,
    OWN_MODULE,
    SEED,
    SILENT_EVALUATOR,
    simple_form_problem,
)


def _openevolve_folder(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "initial_program.py").write_text(SEED)
    (root / "evaluator.py").write_text(SILENT_EVALUATOR)
    return root


def _completion(*codes: str) -> str:
    return "".join(f"<variant {k}>\n```python\n{c}```\n</variant {k}>\n" for k, c in enumerate(codes, start=1))


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def _stored(db: Path) -> dict[str, tuple]:
    """Program code's editable body -> (id, scores, error kind, swallowed) of every stored program."""
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT p.id, p.code, e.scores, e.error_kind, e.swallowed FROM programs p JOIN evaluations e "
            "ON e.program_id = p.id"
        ).fetchall()
    out = {}
    for pid, code, scores, kind, swallowed in rows:
        key = next((c for c in (BROKEN, HALF_BROKEN, EXACT) if c in code), "seed")
        out[key] = (pid, json.loads(scores), kind, json.loads(swallowed) if swallowed else None)
    return out


def _next_prompt(db: Path, parent_id: int) -> str:
    """The prompt the engine builds with `parent_id` as parent: its archive reads (ParentReads) and the builder."""
    from evolve.prompts.builder import PromptInputs, build_prompt

    archive = Archive(db)
    try:
        reads = archive.prompt_reads(parent_id, [], 3, 0)
        [ev] = [p.evaluation for p in [archive.program(parent_id)] if p is not None]
    finally:
        archive.close()
    from evolve.problem.outcome import SwallowedError

    inputs = PromptInputs(
        "Square the input.",
        reads.codes[parent_id],
        ev.scores,
        reads.context.feedback,
        [],
        2,
        "full",
        parent_stderr=reads.context.stderr,
        parent_case_errors=reads.context.case_errors,
        recent_failures=reads.recent_failures,
        parent_swallowed=[SwallowedError.from_dict(e) for e in reads.context.swallowed or ()],
    )
    return build_prompt(inputs)


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_a_swallowed_name_error_reaches_the_archive_show_and_the_next_prompt(tmp_path, sandbox):
    if sandbox == "docker":
        hiding_sandbox("docker", 1).close()  # a skip (a failure in CI) when no daemon answers
    folder = _openevolve_folder(tmp_path / "silent")
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([_completion(BROKEN, HALF_BROKEN), _completion(EXACT)]))
    db = tmp_path / "run.db"
    args = ["run", str(folder), "--db", str(db), "--policy", f"replay:{replay}", "--sandbox", sandbox]
    args += ["--workers", "1", "--group-size", "1", "--variants", "2", "--max-evaluations", "4"]
    args += ["--edit-format", "full", "--no-stop-when-solved", "--stall-groups", "1000"]
    ran = _cli(*args)
    assert ran.exit_code == 0, ran.stdout + ran.stderr

    with sqlite3.connect(db) as con:
        [(broken_id,)] = con.execute("SELECT id FROM programs WHERE code LIKE '%return fooo * x%'").fetchall()
    shown = _cli("show", str(db), str(broken_id))
    assert shown.exit_code == 0, shown.stderr
    assert "raised into the evaluator: NameError: name 'fooo' is not defined (" in shown.stdout, shown.stdout
    assert "line 3, 6 times)" in shown.stdout
    # stored with the evaluation, which scored it a plain 0 with no error: the evaluator hid it
    rows = _stored(db)
    assert rows[BROKEN][1:3] == ({"combined_score": 0.0, "close": 0.0}, None)
    [entry] = rows[BROKEN][3]
    assert {k: entry[k] for k in ("type", "message", "line", "code", "count")} == {
        "type": "NameError",
        "message": "name 'fooo' is not defined",
        "line": 3,
        "code": "return fooo * x",
        "count": 6,
    }
    assert rows[HALF_BROKEN][3] == [
        {
            "type": "IndexError",
            "message": "list index out of range",
            "file": entry["file"],
            "line": 4,
            "code": "return [][x]",
            "count": 3,
        }
    ]
    assert rows[EXACT][1:] == ({"combined_score": 1.0, "close": 1.0}, None, None)  # honest: nothing recorded
    assert rows["seed"][3] is None

    prompt = _next_prompt(db, broken_id)
    assert f"Exceptions its code raised while it was evaluated (most frequent first):\n\n- {NAME_ERROR_LINE}" in prompt
    assert "- IndexError: list index out of range (line 4, 3 times) at `return [][x]`" in _next_prompt(
        db, rows[HALF_BROKEN][0]
    )
    assert "Exceptions its code raised" not in _next_prompt(db, rows[EXACT][0])


SPLIT_CANDIDATE = """
def helper(x):
    return undefined_name + x

def solve(x):
    try:
        helper(x)  # caught here, by the candidate itself: not recorded
    except NameError:
        pass
    if x == 3:
        return helper(x)  # escapes into the harness: recorded, once (case c1 only)
    return x * x
"""

# Simple form: what the candidate catches itself, even through its own module object, is not recorded.
SELF_CATCHING = (
    OWN_MODULE
    + """
def helper(x):
    raise KeyError(x)

def solve(x):
    assert _me().helper is not helper  # the evaluator's view of it: watched
    try:
        _me().helper(x)
    except KeyError:
        pass
    try:
        helper(x)
    except KeyError:
        pass
    return x * x
"""
)


@pytest.fixture(scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request):
    box = hiding_sandbox(request.param, 2)
    yield box
    box.close()


@pytest.fixture(scope="module")
def simple_problem(tmp_path_factory):
    return simple_form_problem(tmp_path_factory.mktemp("simple"))


def test_split_form_records_what_escapes_into_the_harness_only(sandbox, tmp_path):
    problem = load_problem(write_problem(tmp_path / "split"))
    outcome = sandbox.evaluate(problem, SPLIT_CANDIDATE)
    assert outcome.scores == {"c0": 1.0, "c1": 0.0}
    assert [e.as_dict() for e in outcome.swallowed] == [
        {
            "type": "NameError",
            "message": "name 'undefined_name' is not defined",
            "file": "seed.py",
            "line": 3,
            "code": "return undefined_name + x",
            "count": 1,
        }
    ]


def test_what_the_candidate_catches_itself_is_not_recorded(sandbox, simple_problem):
    outcome = sandbox.evaluate(simple_problem, SELF_CATCHING)
    assert (outcome.scores, outcome.swallowed) == ({"combined_score": 1.0, "close": 1.0}, [])
    broken = sandbox.evaluate(simple_problem, BROKEN)
    assert [e.shown() for e in broken.swallowed] == [NAME_ERROR_LINE.replace("line 3", "line 2")]


def test_an_archive_of_the_previous_version_upgrades_with_no_swallowed_errors(tmp_path):
    from tests.helpers import downgrade_archive, square_run, store_program

    _, archive, run, _ = square_run(tmp_path)
    pid, _ = store_program(archive, run.id, SEED, evaluation={"scores": {"c0": 0.0}, "scalar": 0.0, "duration_s": 1})
    archive.close()
    downgrade_archive(tmp_path / "a.db", "0007_issue25")
    with sqlite3.connect(tmp_path / "a.db") as con:
        assert "swallowed" not in {row[1] for row in con.execute("PRAGMA table_info(evaluations)")}
    archive = Archive(tmp_path / "a.db")
    try:
        program = archive.program(pid)
        assert program is not None and program.evaluation is not None and program.evaluation.swallowed is None
        assert archive.prompt_reads(pid, [], 3, 0).context.swallowed is None
    finally:
        archive.close()
    assert KNOWN  # the same helpers' problem as every other archive test
