"""The loop's seams for throughput: a threaded sandbox gets every slot `--workers` asks for (more than asyncio's
default thread pool holds), and a sandbox that declares `AsyncSandbox` is awaited on the loop, no thread per
slot. Real SQLite archive, replayed completions, in-process sandboxes that score at once."""

from __future__ import annotations

import asyncio
import sqlite3
import threading

from evolve.loop import SearchLoop, run_search
from evolve.problem import Problem
from evolve.problem.outcome import EvalOutcome
from policies.replay import ReplayPolicy
from sandboxes.sandbox import AsyncSandbox
from tests.helpers import square_run

WORKERS = 40  # more than asyncio's default pool (cores + 4, at most 32) on any machine


def distinct_children(n: int) -> list[str]:
    """n completions of two new, valid children each (the square problem asks for two variants)."""
    return [
        "".join(
            f"<variant {i}>\n```python\ndef solve(x):\n    return x * {2 * k + i}\n```\n</variant {i}>\n"
            for i in (1, 2)
        )
        for k in range(n)
    ]


def _outcome(problem: Problem) -> EvalOutcome:
    return EvalOutcome({c.name: 0.5 for c in problem.components}, None, None, 0.0, "test")


class GatheringSandbox:
    """Holds each of the first WORKERS child evaluations until that many are in flight at once (or 20 s pass),
    so the peak it records is how many slots the loop really gave it."""

    kind = "test"
    hides_files = True

    def __init__(self, seed: str) -> None:
        self.seed, self.in_flight, self.peak = seed, 0, 0
        self.gave_up = False  # one wait timed out: the peak will not come, so the rest run at once
        self.changed = threading.Condition()

    def isolation(self) -> str:
        return "none (test)"

    def evaluate(self, problem: Problem, code: str) -> EvalOutcome:
        with self.changed:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.changed.notify_all()
            if code != self.seed and not self.gave_up:
                self.gave_up = not self.changed.wait_for(lambda: self.peak >= WORKERS, timeout=20)
            self.in_flight -= 1
        return _outcome(problem)

    def close(self) -> None:
        pass


class AwaitedSandbox:
    """Counts which path the loop took: `aevaluate` on the loop's own thread, or `evaluate` on a worker."""

    kind = "test"
    hides_files = True

    def __init__(self) -> None:
        self.awaited_on: set[str] = set()
        self.awaited = self.threaded = 0

    def isolation(self) -> str:
        return "none (test)"

    async def aevaluate(self, problem: Problem, code: str) -> EvalOutcome:
        self.awaited += 1
        self.awaited_on.add(threading.current_thread().name)
        await asyncio.sleep(0)
        return _outcome(problem)

    def evaluate(self, problem: Problem, code: str) -> EvalOutcome:
        self.threaded += 1
        return _outcome(problem)

    def close(self) -> None:
        pass


def test_a_threaded_sandbox_gets_every_slot_it_asks_for(tmp_path):
    budget = 1 + 2 * WORKERS  # the seed, then ten groups of 4 completions x 2 variants
    problem, archive, run, options = square_run(tmp_path, workers=WORKERS, max_evaluations=budget)
    sandbox = GatheringSandbox(problem.seed_code)
    assert not isinstance(sandbox, AsyncSandbox)
    reason = run_search(SearchLoop(problem, archive, ReplayPolicy(distinct_children(budget)), sandbox, run, options))
    assert reason == "evaluation budget reached"
    assert sandbox.peak == WORKERS
    con = sqlite3.connect(tmp_path / "a.db")
    assert con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == budget


def test_an_async_sandbox_is_awaited_on_the_loop_and_every_child_lands(tmp_path):
    problem, archive, run, options = square_run(tmp_path, workers=8, max_evaluations=33)
    sandbox = AwaitedSandbox()
    assert isinstance(sandbox, AsyncSandbox)
    reason = run_search(SearchLoop(problem, archive, ReplayPolicy(distinct_children(40)), sandbox, run, options))
    assert reason == "evaluation budget reached"
    assert (sandbox.threaded, sandbox.awaited) == (1, 32)  # the seed, scored before the workers start; then all
    assert sandbox.awaited_on == {threading.main_thread().name}
    con = sqlite3.connect(tmp_path / "a.db")
    assert con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == 33
    assert con.execute("SELECT COUNT(*) FROM variants WHERE program_id IS NOT NULL").fetchone()[0] == 32
