"""The run ledger (evolve/ledger.py) as the loop applies records to it: failure streaks end when a stage succeeds,
not when its whole group is stored, and the run's typed state keeps what it does not name."""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import replace

from evolve.archive import Archive
from evolve.archive.records import RunState
from evolve.loop import SearchLoop, run_search
from evolve.runs import open_run
from policies.policy import Generated
from policies.replay import ReplayPolicy
from sandboxes.process import ProcessSandbox
from tests.helpers import square_run

WAIT_S = 30.0  # a bound on each hand-over below, never reached when the code is right


def answer(k: int) -> str:
    return f"<variant 1>\n```python\ndef solve(x):\n    return x * x + {k}\n```\n</variant 1>\n"


class Interleaved:
    """Two generators at once: call 2 fails; call 1 succeeds once it has; call 3 fails once call 1 is back; call 4
    fails once group 1 is being stored; every later call succeeds."""

    name, version, max_concurrency = "interleaved", 0, 2

    def __init__(self, storing: threading.Event) -> None:
        self.calls, self.lock, self.storing = 0, threading.Lock(), storing
        self.second_failed, self.first_back, self.fourth_failed = (
            threading.Event(),
            threading.Event(),
            threading.Event(),
        )

    def generate(self, prompt, params, n):
        with self.lock:
            self.calls += 1
            k = self.calls
        if k == 1:
            self.second_failed.wait(WAIT_S)
            self.first_back.set()
        elif k == 2:
            self.second_failed.set()
            raise ConnectionError("refused 2")
        elif k == 3:
            self.first_back.wait(WAIT_S)
            raise ConnectionError("refused 3")
        elif k == 4:
            self.storing.wait(WAIT_S)
            self.fourth_failed.set()
            raise ConnectionError("refused 4")
        return [Generated(answer(k), None, None, "stop", 0) for _ in range(n)]

    def close(self) -> None:
        pass


def test_a_failure_streak_ends_when_the_stage_succeeds_not_when_its_group_is_stored(tmp_path):
    """Sampling fails, succeeds, fails, fails, with 3 in a row the limit: the success between ends the streak at
    once, although its group is still being stored when the last failure comes. Counted from the store, the three
    failures were `in a row` and the run stopped as systemic."""
    problem, archive, run, options = square_run(
        tmp_path, group_size=1, variants=1, max_evaluations=20, max_groups=6, workers=1, max_failures=3
    )
    storing = threading.Event()
    policy = Interleaved(storing)
    store = archive.add_group

    def held_store(*args, **kwargs):
        if not storing.is_set():  # group 1: stored only after the fourth call has failed
            storing.set()
            policy.fourth_failed.wait(WAIT_S)
        return store(*args, **kwargs)

    archive.add_group = held_store  # type: ignore[method-assign]
    loop = SearchLoop(problem, archive, policy, ProcessSandbox(slots=1), run, options)
    try:
        reason = run_search(loop)
        assert policy.fourth_failed.is_set()  # the interleaving happened as described
        assert reason == "group budget reached", reason
        assert loop.stats.incidents == 3 and loop.stats.groups == 3
    finally:
        loop.sandbox.close()
        archive.close()


def test_the_run_state_keeps_keys_it_does_not_name(tmp_path):
    """A state written by an older engine or another tool keeps its other keys through a session's saves."""
    problem, archive, run, options = square_run(tmp_path, max_evaluations=1)
    archive.update_run(run.id, state=RunState.of({"elapsed_s": 2.5, "ask": "full edits", "note": {"by": "a tool"}}))
    run = archive.find_run(run.id)
    loop = SearchLoop(problem, archive, Interleaved(threading.Event()), ProcessSandbox(slots=1), run, options)
    try:
        run_search(loop)
        saved = json.loads(sqlite3.connect(tmp_path / "a.db").execute("SELECT state FROM runs").fetchone()[0])
        assert archive.find_run(run.id).state == RunState.of(saved)
        assert saved["ask"] == "full edits" and saved["note"] == {"by": "a tool"}
        assert saved["elapsed_s"] > 2.5 and saved["stop_reason"] == "evaluation budget reached"
        assert RunState.of(saved).as_json() == saved
    finally:
        loop.sandbox.close()
        archive.close()


def _answer(k: int) -> str:
    return f"<variant 1>\n```python\ndef solve(x):\n    return x * x + {k}\n```\n</variant 1>\n"


def _session(problem, archive, run, options, answers: int = 40) -> SearchLoop:
    policy = ReplayPolicy([_answer(k) for k in range(answers)])
    loop = SearchLoop(problem, archive, policy, ProcessSandbox(slots=1), run, options)
    try:
        run_search(loop)
    finally:
        loop.sandbox.close()
    return loop


def test_a_stored_batch_that_never_applies_is_a_commit_failure_repeated_and_stops_the_run(tmp_path):
    problem, archive, run, options = square_run(
        tmp_path, group_size=1, variants=1, max_evaluations=50, max_groups=12, workers=1, max_failures=3
    )
    loop = SearchLoop(problem, archive, ReplayPolicy([_answer(k) for k in range(40)]), ProcessSandbox(1), run, options)
    applied = loop.ledger.child_stored

    def broken(stored):  # the batch is in the archive; applying its children to the ledger fails, every time
        if stored.child.parent_id is None:
            return applied(stored)  # the seed lands as usual
        raise RuntimeError("cannot apply a stored child")

    loop.ledger.child_stored = broken  # type: ignore[method-assign]
    try:
        reason = run_search(loop)
    finally:
        loop.sandbox.close()
        archive.close()
    assert reason.startswith("stopped: 3 commit failures in a row (RuntimeError"), (reason, loop.stats.incidents)


def test_a_batch_that_fails_after_its_children_were_counted_gives_each_reservation_back_once(tmp_path):
    """Applying a stored child fails after the child was counted: its evaluation's reservation ends once, so the
    budget is not handed out again and the archive never holds more evaluations than `max_evaluations`."""
    problem, archive, run, options = square_run(
        tmp_path, group_size=1, variants=1, max_evaluations=8, workers=1, max_failures=50
    )
    loop = SearchLoop(problem, archive, ReplayPolicy([_answer(k) for k in range(60)]), ProcessSandbox(1), run, options)
    applied, late_failures = loop.ledger.child_stored, []

    def fails_once_applied(stored):  # counted, reservation ended ... then a later step of the commit raises
        applied(stored)
        if stored.child.parent_id is not None and len(late_failures) < 3:
            late_failures.append(stored.program_id)
            raise RuntimeError("fails after the child was applied")

    loop.ledger.child_stored = fails_once_applied  # type: ignore[method-assign]
    try:
        run_search(loop)
    finally:
        loop.sandbox.close()
        archive.close()
    stored = sqlite3.connect(tmp_path / "a.db").execute("SELECT count(*) FROM evaluations").fetchone()[0]
    assert len(late_failures) == 3
    assert (stored, loop.stats.evaluations, loop.control.in_flight) == (8, 8, 0)


def test_a_session_that_ended_cleanly_leaves_a_record_that_resumes_without_a_kill_counted(tmp_path):
    problem, archive, run, options = square_run(tmp_path, group_size=1, variants=1, max_evaluations=3, workers=1)
    first = _session(problem, archive, run, options)
    assert first.run.status == archive.find_run(run.id).status != "running"
    more = replace(options, max_evaluations=5)
    resumed = open_run(archive, problem, more, run=first.run).run
    second = _session(problem, archive, resumed, more)
    assert second.run.status == archive.find_run(run.id).status != "running"
    open_run(archive, problem, replace(more, max_evaluations=7), run=second.run)
    interruptions = archive.find_run(run.id).state.interruptions
    archive.close()
    assert interruptions == 0


def test_a_run_whose_stored_state_holds_unreadable_values_still_opens_and_keeps_them(tmp_path):
    """A state edited by hand or written by another tool: the run is found and resumed, its bad values read as
    their defaults, its other keys kept."""
    problem, archive, run, options = square_run(tmp_path, max_evaluations=1)
    archive.close()
    con = sqlite3.connect(tmp_path / "a.db")
    bad = {"elapsed_s": "n/a", "interruptions": [1], "stop_reason": 3, "adaptations": "x", "note": "kept"}
    con.execute("UPDATE runs SET state = ?", (json.dumps(bad),))
    con.commit()
    con.close()
    archive = Archive(tmp_path / "a.db")
    found = archive.find_run(run.id)
    assert (found.state.elapsed_s, found.state.interruptions, found.state.stop_reason) == (0.0, 0, None)
    assert found.state.adaptations == () and found.state.extra == {"note": "kept"}
    assert open_run(archive, problem, options, run=found).resumed
    archive.close()
