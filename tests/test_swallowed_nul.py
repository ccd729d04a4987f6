"""A NUL in text a candidate produced (a swallowed message, a split-form case error, its stdout) on both databases
(red team 59). PostgreSQL refuses NUL in a text column and SQLite keeps it: each prompt built from such a program
failed to store (`store: DataError`) and after five in a row the PostgreSQL run stopped, while SQLite reached its
budget. Seen failing on PostgreSQL before evolve/storable.py wrote NUL as the visible `\\x00`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from evolve.archive import Archive
from evolve.cli import app
from evolve.problem.samples import write_problem
from evolve.storable import storable_text
from tests.swallowed_cases import EXACT, SILENT_EVALUATOR

# Odd inputs raise ValueError('m\x00n') into the evaluator, which swallows it and scores the rest.
NUL_SEED = (
    '# EVOLVE-BLOCK-START\ndef solve(x):\n    if x % 2:\n        raise ValueError("m\\x00n")\n'
    "    return x + 1\n# EVOLVE-BLOCK-END\n"
)
# Split form: case 3 fails with a NUL in its message (a case error, shown in every prompt built from it), and the
# program prints a NUL on its stdout.
NUL_SPLIT_SEED = (
    "# EVOLVE-BLOCK-START\ndef solve(x):\n    print('out\\x00put')\n    if x == 3:\n"
    "        raise ValueError('m\\x00n')\n    return x * x\n# EVOLVE-BLOCK-END\n"
)


def test_nul_is_stored_as_its_visible_escape_and_the_rest_is_kept():
    assert storable_text("m\x00n") == "m\\x00n"
    assert storable_text("\x00\udcff é\t") == "\\x00\\udcff é\t"
    assert storable_text("plain text") == "plain text"


def _run(folder: Path, url: str, tmp_path: Path) -> None:
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([f"<variant 1>\n```python\n{EXACT}```\n</variant 1>\n"]))
    args = ["run", str(folder), "--db", url, "--policy", f"replay:{replay}", "--sandbox", "process"]
    args += ["--workers", "1", "--group-size", "1", "--variants", "1", "--max-evaluations", "2"]
    args += ["--edit-format", "full", "--no-stop-when-solved", "--stall-groups", "20"]
    ran = CliRunner().invoke(app, args, catch_exceptions=False)
    assert ran.exit_code == 0, ran.stdout[-2000:]
    assert "evaluation budget reached: 2 evaluations" in ran.stdout, ran.stdout[-2000:]


def _stored(url: str, columns: str) -> tuple:
    archive = Archive(url)
    try:
        with archive.db.engine.connect() as con:
            incidents = con.execute(text("SELECT stage, kind FROM incidents")).fetchall()
            row = con.execute(text(f"SELECT {columns} FROM evaluations WHERE program_id = 1")).one()
    finally:
        archive.close()
    assert incidents == []
    return tuple(json.loads(v) if isinstance(v, str) and v[:1] in "[{" else v for v in row)


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_nul_in_a_swallowed_message_does_not_stop_the_run(database, tmp_path, request):
    url = str(tmp_path / "a.db") if database == "sqlite" else request.getfixturevalue("postgres_cluster").new_database()
    folder = tmp_path / "silent"
    folder.mkdir()
    (folder / "initial_program.py").write_text(NUL_SEED)
    (folder / "evaluator.py").write_text(SILENT_EVALUATOR)
    _run(folder, url, tmp_path)
    (swallowed,) = _stored(url, "swallowed")
    assert [{k: e[k] for k in ("type", "message", "line", "count")} for e in swallowed] == [
        {"type": "ValueError", "message": "m\\x00n", "line": 4, "count": 3}
    ]


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_nul_in_a_case_error_and_on_stdout_does_not_stop_the_run(database, tmp_path, request):
    """Older than the swallowed record: the case error and stdout of a split-form program stopped it the same way."""
    url = str(tmp_path / "a.db") if database == "sqlite" else request.getfixturevalue("postgres_cluster").new_database()
    folder = write_problem(tmp_path / "p", seed=NUL_SPLIT_SEED)
    _run(folder, url, tmp_path)
    case_errors, stdout = _stored(url, "case_errors, stdout")
    assert [k for k, v in case_errors.items() if "m\\x00n" in v] == ["c1"] and "\x00" not in json.dumps(case_errors)
    assert "out\\x00put" in stdout and "\x00" not in stdout
