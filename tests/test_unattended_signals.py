"""Runs left alone: SIGTERM stops a run cleanly, and a killed run is recognised and resumed exactly."""

from __future__ import annotations

import json
import sqlite3
import subprocess

import pytest

from tests.helpers import executions, log_executions
from tests.unattended_runs import (
    EVOLVE,
    evolve,
    init_with_replay,
    unique_children,
)

pytestmark = pytest.mark.slow


def test_sigterm_stops_cleanly_and_a_killed_run_is_recognised(tmp_path, initialised):
    """SIGTERM leaves the run `stopped` (never `running`); a run found `running` is resumed as interrupted.

    The evaluator logs every real execution: at the stop, every scored row had one, and at most the one
    evaluation in flight (one worker) ran without a row; the resumed session executes each child once (one row
    each; a job that failed whole never reaches score(), so only rows without an error are counted)."""
    import os
    import signal
    import time

    folder, replay = init_with_replay(tmp_path, initialised, unique_children(40))
    log = log_executions(folder, tmp_path / "executions.log")
    db = tmp_path / "d.db"
    cmd = [*EVOLVE, "run", str(folder), "--db", str(db), "--policy", f"replay:{replay}", "--sandbox", "process"]
    proc = subprocess.Popen([*cmd, "--max-evaluations", "100", "--workers", "1"], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            if sqlite3.connect(db).execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] >= 3:
                break
        except sqlite3.Error:
            continue
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert "interrupted" in out and "Traceback" not in out
    assert sqlite3.connect(db).execute("SELECT status FROM runs").fetchone()[0] == "stopped"
    scored = "SELECT COUNT(*) FROM evaluations WHERE error_kind IS NULL"
    stopped_with = sqlite3.connect(db).execute(scored).fetchone()[0]
    executed = len(executions(log))
    assert stopped_with <= executed <= stopped_with + 1
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET status = 'running', updated_at = '2000-01-01 00:00:00'")  # as a SIGKILL leaves it
    con.commit()
    shown = json.loads(evolve("inspect", str(db), "--json").stdout)[0]
    assert shown["status"] == "interrupted"
    # a larger budget: the resumed replay starts again at its first text, so it re-sends children already
    # evaluated (duplicates, never executed again) before it reaches new ones
    again = evolve(*cmd[3:], "--max-evaluations", "30")
    assert "was interrupted (its process was killed)" in again.stdout, again.stdout + again.stderr
    shown = json.loads(evolve("inspect", str(db), "--json").stdout)[0]
    assert shown["status"] == "finished" and shown["interruptions"] == 1 and shown["evaluations"] == 30
    now = sqlite3.connect(db).execute(scored).fetchone()[0]
    assert len(executions(log)) - executed == now - stopped_with, (executed, stopped_with, executions(log))
