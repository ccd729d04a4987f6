"""The loop end to end with a tiny real model, a real SQLite archive and the process sandbox."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError, ProgrammingError

from evolve.archive import archive_url
from tests.helpers import evolve_run_cmd, executions, log_executions, write_square_problem

pytestmark = pytest.mark.slow


def test_search_runs_to_budget_and_archives_everything(tiny_search):
    """The session's short search (tests.conftest.tiny_search: square_run's options, a budget of 8, the process
    sandbox with two slots), checked where it is made once for the tests that train on its archive."""
    assert tiny_search.reason == "evaluation budget reached"
    stats = tiny_search.stats
    con = sqlite3.connect(f"file:{tiny_search.db}?mode=ro", uri=True)
    programs = con.execute("SELECT COUNT(*) FROM programs").fetchone()[0]
    evaluations = con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
    assert programs == evaluations == 8
    assert con.execute("SELECT COUNT(*) FROM programs WHERE parent_id IS NULL").fetchone()[0] == 1
    groups, completions = (
        con.execute("SELECT COUNT(*) FROM prompts").fetchone()[0],
        con.execute("SELECT COUNT(*) FROM completions").fetchone()[0],
    )
    assert completions == 4 * groups
    # every completion keeps its sampled tokens and one logprob per token, attributed to a policy version
    for ids, lps, version in con.execute("SELECT token_ids, logprobs, policy_version_id FROM completions"):
        assert len(ids) // 4 == len(lps) // 4 > 0 and version is not None
    assert con.execute("SELECT COUNT(*) FROM variants").fetchone()[0] == 2 * completions
    # the taught answers solve the problem: x * x scores 1 on both cases
    assert stats.best_scalar == 1.0
    assert set(stats.parse) <= {"ok", "duplicate", "parse_error", "syntax_error", "unchanged", "apply_error"}
    # children of variants point back to them; duplicates are recorded, not evaluated again
    linked = con.execute("SELECT COUNT(*) FROM variants WHERE status = 'ok' AND program_id IS NOT NULL").fetchone()[0]
    assert (
        linked
        == programs
        - 1
        - con.execute("SELECT COUNT(*) FROM variants WHERE status = 'ok' AND program_id IS NULL").fetchone()[0]
        or linked >= 7
    )
    assert con.execute("SELECT status FROM runs").fetchone()[0] == "finished"


def test_kill_9_mid_run_then_resume_finishes_without_duplicates(tmp_path, tiny_model_dir, postgres_cluster):
    """On PostgreSQL, with the tiny model: a run killed with SIGKILL resumes with the same command and ends exact.
    (On SQLite, tests/test_soak.py asserts all of this of a run killed six times at random moments.)

    Executions are counted by the evaluator (tests.helpers.log_executions), not by archive rows, which would
    record a second execution of a child as a `duplicate` and still add up. Exactly right: before the kill, every
    scored row had an execution, and some executions may have no row yet (scored, not committed when the kill
    came: lost work, their children pending); after it, every execution of the resumed session is a new row.
    (A job that failed whole, e.g. a timeout on a loaded machine, never reaches score(): only rows without an
    error are counted.)
    """
    folder = write_square_problem(tmp_path / "sq")
    log = log_executions(folder, tmp_path / "executions.log")
    db = postgres_cluster.new_database()
    engine = create_engine(archive_url(db))

    def scalar(sql: str, **params: object) -> object:
        with engine.connect() as con:
            return con.execute(text(sql), params).scalar()

    def evaluations() -> int:
        try:
            return int(scalar("SELECT COUNT(*) FROM evaluations"))  # type: ignore[arg-type]
        except OperationalError:  # not created yet, or SQLite busy
            return 0
        except ProgrammingError:  # PostgreSQL: the table does not exist yet
            return 0

    cmd = evolve_run_cmd(folder, db, f"transformers:{tiny_model_dir}", 11, "--workers", "2")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        if evaluations() >= 3:
            break
    assert proc.poll() is None, "the run ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = evaluations()
    assert 3 <= before < 11
    scored_before = scalar("SELECT COUNT(*) FROM evaluations WHERE error_kind IS NULL")
    executed_before = len(executions(log))
    assert executed_before >= scored_before
    assert scalar("SELECT status FROM runs") == "running"
    with engine.connect() as con:
        pending = {
            v for (v,) in con.execute(text("SELECT id FROM variants WHERE status = 'ok' AND program_id IS NULL"))
        }
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "resuming run 1" in out.stdout and "evaluation budget reached" in out.stdout, out.stdout
    assert scalar("SELECT COUNT(*) FROM runs") == 1
    assert scalar("SELECT COUNT(*) FROM programs WHERE parent_id IS NULL") == 1  # seed once
    assert scalar("SELECT COUNT(*) FROM evaluations") == 11
    # no child executed twice: each execution after the kill made its own evaluation row
    scored = scalar("SELECT COUNT(*) FROM evaluations WHERE error_kind IS NULL")
    assert len(executions(log)) - executed_before == scored - scored_before, (executed_before, executions(log))
    assert scalar("SELECT COUNT(*) - COUNT(DISTINCT code_hash) FROM programs") == 0
    # every child pending at the kill is evaluated first on resume (or found to be a duplicate)
    with engine.connect() as con:
        for vid in pending:
            status, program = con.execute(
                text("SELECT status, program_id FROM variants WHERE id = :v"), {"v": vid}
            ).one()
            assert program is not None or status != "ok", (vid, status)
    # generations follow parents
    bad = scalar(
        "SELECT COUNT(*) FROM programs c JOIN programs p ON c.parent_id = p.id WHERE c.generation != p.generation + 1"
    )
    assert bad == 0
    assert scalar("SELECT status FROM runs") == "finished"
    engine.dispose()


def test_cli_readers_work_on_the_archive(tmp_path, tiny_search):
    """The readers on a copy of the session's short search (8 evaluations by the tiny model), in this process,
    through the command-line app (each `python -m evolve.cli` would only import the engine again). The kill -9
    test above runs `evolve run` itself with this model."""
    db = tiny_search.copy_to(tmp_path / "run.db")
    inspect = _cli("inspect", str(db), "--json")

    summary = json.loads(inspect.stdout)[0]
    assert summary["evaluations"] == 8 and summary["problem"] == "square"
    assert summary["best_components"]["c0"][1] == 1.0
    # telemetry kept: tokens and seconds per group, start/end per evaluation, and the run's totals
    t = summary["telemetry"]
    assert t["tokens"] > 0 and t["generation_s"] > 0 and t["tokens_per_s"] > 0 and t["evaluations_per_min"] > 0
    assert t["valid_children_per_1k_tokens"] == pytest.approx(1000 * t["valid_children"] / t["tokens"])
    con = sqlite3.connect(db)
    for started, finished, sandbox in con.execute("SELECT started_at, finished_at, sandbox FROM evaluations"):
        assert started <= finished and sandbox == "process"
    for tokens, seconds, counts in con.execute("SELECT tokens, generation_s, parse_counts FROM prompts"):
        assert tokens > 0 and seconds > 0 and sum(json.loads(counts).values()) == 4 * 2
    best = _cli("best", str(db))
    assert best.exit_code == 0 and "def solve" in best.stdout
    pid = summary["best_scalar"][0]
    show = _cli("show", str(db), str(pid))
    assert show.exit_code == 0 and "lineage" in show.stdout
    export = _cli("export", str(db), str(tmp_path / "out"))
    assert export.exit_code == 0
    rows = (tmp_path / "out" / "evaluations.csv").read_text().splitlines()
    assert len(rows) == 9 and rows[0].startswith("program_id,parent_id")
    report = _cli("report", str(db))
    assert report.exit_code == 0 and report.stdout.startswith("# square: run 1")
    assert "| c0 | 1 |" in report.stdout and "```python" in report.stdout
    missing = _cli("inspect", str(tmp_path / "nope.db"))
    assert missing.exit_code == 2 and "no archive there" in missing.stderr


def _cli(*args: str):
    from typer.testing import CliRunner

    from evolve.cli import app

    return CliRunner().invoke(app, list(args), catch_exceptions=False)
