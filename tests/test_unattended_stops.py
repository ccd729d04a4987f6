"""Runs left alone: the stop rules (stall, patience, solved) judge evaluated children and strand none."""

from __future__ import annotations

import sqlite3

import pytest

from sandboxes.process import ProcessSandbox
from tests.unattended_runs import (
    hidden_expr,
    pending_children,
    run_replay,
    unique_children,
)

pytestmark = pytest.mark.slow


def test_stall_is_judged_on_evaluated_children_and_strands_nothing(tmp_path, initialised):
    """A fast policy repeating 6 completions (18 children) to one worker: every child is evaluated before the
    run calls itself stalled (issue 9 saw 20 of 24 left pending)."""
    out, db = run_replay(tmp_path, initialised, unique_children(6), "--max-evaluations", "200")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "stalled" in out.stdout
    assert pending_children(db) == 0
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == 1 + 18


def test_patience_stops_and_drains_the_queue(tmp_path, initialised):
    out, db = run_replay(tmp_path, initialised, unique_children(30), "--max-evaluations", "200", "--patience", "4")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "patience: no new best scalar in 4 evaluations" in out.stdout
    assert pending_children(db) == 0
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] < 1 + 90


def test_a_solved_problem_stops_by_itself(tmp_path, initialised):
    """Bounds [0, 1] on every case: a child scoring 1.0 everywhere solves it; the queue is still drained."""
    hidden = (initialised / "evaluate.py").read_text()
    exact = "<variant 1>\n```python\ndef solve(x):\n    return x\n```\n</variant 1>"
    texts = [*unique_children(3), exact.replace("return x", f"return {hidden_expr(hidden)}")]
    out, db = run_replay(tmp_path, initialised, texts, "--max-evaluations", "200")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "solved: every component reached its best declared bound" in out.stdout, out.stdout
    assert pending_children(db) == 0


def test_copies_of_a_child_still_being_stored_do_not_count_towards_a_stall(tmp_path):
    """Seen in CI: the group that found the solving child was slow to store it, the other generators' groups (all
    copies of it, so duplicates) counted as barren meanwhile, and the run ended `stalled` while that child, once
    evaluated, solved the problem. A child claimed by a group not yet queued is pending work."""
    import time

    from evolve.loop import SearchLoop, run_search
    from policies.replay import ReplayPolicy
    from tests.helpers import square_run

    problem, archive, run, options = square_run(
        tmp_path, max_evaluations=50, stall_groups=3, workers=1, stop_when_solved=True
    )
    store, calls = archive.add_group, []

    def slow_first_store(*args, **kwargs):  # a disk busy for one second, once
        calls.append(1)
        if len(calls) == 1:
            time.sleep(1.0)
        return store(*args, **kwargs)

    archive.add_group = slow_first_store
    policy = ReplayPolicy(["<variant 1>\n```python\ndef solve(x):\n    return x * x\n```\n</variant 1>"])
    sandbox = ProcessSandbox(slots=1)
    try:
        reason = run_search(SearchLoop(problem, archive, policy, sandbox, run, options))
    finally:
        sandbox.close()
    assert reason == "solved: every component reached its best declared bound"
    assert 1 < len(calls) < 20  # groups were stored meanwhile, and they waited for that child rather than spun
    assert pending_children(tmp_path / "a.db") == 0
