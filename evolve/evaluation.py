"""The evaluation stage: one child through the sandbox into an `EvaluationResult`.

It holds no run state: the loop's workers (evolve/flow.py) take children from their queue, reserve an evaluation
in the run's ledger, and call `evaluate`. A sandbox failure costs one child, scored as a crash, and comes back as
the `StageFailure` it was; an evaluation killed by Ctrl-C (`AbortableSandbox`) says nothing of the child, which
stays pending in the archive for the resume, and so does one whose trusted scoring Ctrl-C stopped (`abort`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from evolve.archive.clock import utcnow
from evolve.control import StageFailure
from evolve.handoffs import Child, EvaluationResult
from evolve.problem import Problem
from evolve.problem.outcome import ErrorKind, EvalOutcome
from sandboxes.sandbox import AsyncSandbox, Sandbox


@dataclass(frozen=True)
class Evaluated:
    """What one evaluation came to: its result (None: killed by Ctrl-C) and the sandbox's own failure, if any."""

    result: EvaluationResult | None
    failure: StageFailure | None = None


class Evaluator:
    def __init__(self, problem: Problem, sandbox: Sandbox) -> None:
        self.problem, self.sandbox = problem, sandbox
        # cluster sandboxes evaluate without a thread per slot; asked once, not per child
        self.async_sandbox = sandbox if isinstance(sandbox, AsyncSandbox) else None

    async def evaluate(self, child: Child) -> Evaluated:
        """Score one child; a sandbox bug costs this child (a crash outcome), not the run."""
        started, failure = utcnow(), None
        try:
            if self.async_sandbox is not None:
                outcome = await self.async_sandbox.aevaluate(self.problem, child.code)
            else:
                outcome = await asyncio.to_thread(self.sandbox.evaluate, self.problem, child.code)
        except Exception as exc:
            failure = StageFailure("evaluate", exc)
            error = f"sandbox failure: {exc!r}"
            outcome = EvalOutcome.failure(self.problem, ErrorKind.CRASH, error, 0.0, self.sandbox.kind)
        result = None if outcome.aborted else EvaluationResult(child, outcome, started, utcnow())
        return Evaluated(result, failure)

    def abort(self) -> None:
        """Ctrl-C: stop the trusted `score()` calls in flight (the sandbox kills its own candidates). A worker thread
        waiting on one, even one that would never return, comes back at once, and the process can exit."""
        self.problem.abort_scoring()

    async def score_seed(self, seed: Child) -> EvaluationResult | None:
        """The seed, on a worker thread whatever the sandbox; its failure is the run's (there is nothing to evolve
        from). None: Ctrl-C aborted it."""
        started = utcnow()
        outcome = await asyncio.to_thread(self.sandbox.evaluate, self.problem, seed.code)
        return None if outcome.aborted else EvaluationResult(seed, outcome, started, utcnow())
