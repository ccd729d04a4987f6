"""The evaluation stage: children from the queue to the sandbox, results to whoever commits them.

N workers drain one bounded queue. Each takes an evaluation from the run's budget before it starts (`reserve`),
so that no more children are scored than the budget holds; a child taken after the run abandoned its queue (Ctrl-C,
a systemic failure) or past the budget stays pending in the archive for a resume. A sandbox failure costs one
child, scored as a crash; an evaluation killed by Ctrl-C (`AbortableSandbox`) says nothing of the child, which
stays pending too and gives its evaluation back.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from evolve.archive.models import utcnow
from evolve.children import Child, EvaluationResult
from evolve.control import Incidents, RunControl, StageFailure
from evolve.problem import Problem
from evolve.problem.outcome import ErrorKind, EvalOutcome
from sandboxes.base import AsyncSandbox, Sandbox


class ResultSink(Protocol):
    """Where scored children go (the commit stage)."""

    async def submit(self, result: EvaluationResult) -> None: ...


class EvaluationStage:
    def __init__(
        self,
        problem: Problem,
        sandbox: Sandbox,
        control: RunControl,
        incidents: Incidents,
        sink: ResultSink,
        workers: int,
    ) -> None:
        self.problem, self.sandbox, self.control, self.incidents, self.sink = problem, sandbox, control, incidents, sink
        # cluster sandboxes evaluate without a thread per slot; asked once, not per child
        self.async_sandbox = sandbox if isinstance(sandbox, AsyncSandbox) else None
        self.queue: asyncio.Queue[Child] = asyncio.Queue(maxsize=max(2 * workers, 4))
        self.busy = 0  # children taken by a worker and not yet handed to the sink

    async def put(self, child: Child) -> None:
        """Queue a child; waits while the queue is full (the generator runs at most a few groups ahead)."""
        await self.queue.put(child)

    def pending(self) -> int:
        """Children queued or under evaluation."""
        return self.queue.qsize() + self.busy

    async def drained(self) -> None:
        """Every queued child was taken, and scored or left pending."""
        await self.queue.join()

    async def work(self) -> None:
        """One worker: a stop by budget, target, stall or patience still evaluates what is queued; only Ctrl-C, a
        systemic failure or the evaluation budget leave children pending for the next resume."""
        while True:
            child = await self.queue.get()
            if not self.control.reserve():
                self.queue.task_done()
                continue  # left pending in the archive; a resumed run evaluates it
            self.busy += 1
            result = await self.evaluate(child)
            if result is None:  # killed by Ctrl-C: says nothing of the child, which stays pending
                self.control.release()
            else:
                await self.sink.submit(result)
            self.busy -= 1
            self.queue.task_done()

    async def evaluate(self, child: Child) -> EvaluationResult | None:
        """Score one child; a sandbox bug costs this child (a crash outcome), not the run. None: aborted."""
        started = utcnow()
        try:
            if self.async_sandbox is not None:
                outcome = await self.async_sandbox.aevaluate(self.problem, child.code)
            else:
                outcome = await asyncio.to_thread(self.sandbox.evaluate, self.problem, child.code)
            self.incidents.ok("evaluate")
        except Exception as exc:
            self.incidents.record(StageFailure("evaluate", exc))
            error = f"sandbox failure: {exc!r}"
            outcome = EvalOutcome.failure(self.problem, ErrorKind.CRASH, error, 0.0, self.sandbox.kind)
        return None if outcome.aborted else EvaluationResult(child, outcome, started, utcnow())

    async def score_seed(self, seed: Child) -> EvaluationResult | None:
        """The seed, on a worker thread whatever the sandbox; its failure is the run's (there is nothing to evolve
        from). None: Ctrl-C aborted it."""
        started = utcnow()
        outcome = await asyncio.to_thread(self.sandbox.evaluate, self.problem, seed.code)
        return None if outcome.aborted else EvaluationResult(seed, outcome, started, utcnow())
