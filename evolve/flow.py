"""The loop's own path for children: a bounded queue, N evaluation workers, one committer.

Part of the loop (its layer, its thread): each worker reserves an evaluation in the ledger before it starts, so
that no more children are scored than the budget holds, and hands the child to the `Evaluator`; the committer
writes whatever results have landed in one transaction through the `ProgramWriter`, on a worker thread, and
applies each `StoredChild` to the ledger on the event loop. A child taken after the run abandoned its queue
(Ctrl-C, a systemic failure) or past the budget stays pending in the archive for a resume; a stop by budget,
target, stall or patience still evaluates what is queued.
"""

from __future__ import annotations

import asyncio
import contextlib

from evolve.archive import Archive
from evolve.commit import COMMIT_BATCH, ProgramWriter
from evolve.control import StageFailure
from evolve.evaluation import Evaluator
from evolve.handoffs import Child, EvaluationResult
from evolve.ledger import RunLedger


def note_incident(ledger: RunLedger, archive: Archive, run_id: int, failure: StageFailure) -> None:
    """Count an incident in the ledger and store its row; the archive itself may be what failed."""
    seen = ledger.incident(failure)
    with contextlib.suppress(Exception):
        archive.add_incident(run_id, seen.stage, seen.kind, seen.message)


class ChildFlow:
    def __init__(
        self,
        ledger: RunLedger,
        evaluator: Evaluator,
        writer: ProgramWriter,
        archive: Archive,
        run_id: int,
        workers: int,
    ) -> None:
        self.ledger, self.evaluator, self.writer = ledger, evaluator, writer
        self.archive, self.run_id = archive, run_id
        self.queue: asyncio.Queue[Child] = asyncio.Queue(maxsize=max(2 * workers, 4))
        self.results: asyncio.Queue[EvaluationResult] = asyncio.Queue()
        self.busy = 0  # children taken by a worker and not yet handed to the committer
        self.backlog = 0  # results handed to the committer and not yet committed (or given up)

    async def put(self, child: Child) -> None:
        """Queue a child; waits while the queue is full (the generator runs at most a few groups ahead)."""
        await self.queue.put(child)

    def pending(self) -> int:
        """Children queued, under evaluation, or scored and not yet committed."""
        return self.queue.qsize() + self.busy + self.backlog

    async def drained(self) -> None:
        """Every queued child was taken, and scored and committed or left pending."""
        await self.queue.join()
        await self.results.join()

    async def evaluate(self) -> None:
        """One worker."""
        while True:
            child = await self.queue.get()
            if not self.ledger.reserve():
                self.queue.task_done()
                continue  # left pending in the archive; a resumed run evaluates it
            self.busy += 1
            evaluated = await self.evaluator.evaluate(child)
            if evaluated.failure is not None:
                note_incident(self.ledger, self.archive, self.run_id, evaluated.failure)
            else:
                self.ledger.ok("evaluate")
            if evaluated.result is None:  # killed by Ctrl-C: says nothing of the child, which stays pending
                self.ledger.release()
            else:
                self.backlog += 1
                await self.results.put(evaluated.result)
            self.busy -= 1
            self.queue.task_done()

    async def commit_landed(self) -> None:
        """The committer: whatever results have landed, one transaction a batch. A failed batch costs these
        children (a failed write leaves them pending; `commit` gives their evaluations back); a broken archive
        repeats and stops the run."""
        while True:
            batch = [await self.results.get()]
            while len(batch) < COMMIT_BATCH and not self.results.empty():
                batch.append(self.results.get_nowait())
            try:
                await self.commit(batch)
            except Exception as exc:
                note_incident(self.ledger, self.archive, self.run_id, StageFailure("commit", exc))
            finally:
                self.backlog -= len(batch)
                for _ in batch:
                    self.results.task_done()

    async def commit(self, batch: list[EvaluationResult]) -> None:
        """Write the batch on a worker thread, then apply what became of each child to the ledger, here. The
        batch's reservations end here, once, whatever became of it: counted, stored meanwhile by another child, or
        a failed write or application (given back). Ending them in one place is what keeps a failure part-way
        through the application from ending a child's reservation twice and overrunning the budget; no other task
        runs between the counting and the release (nothing is awaited), so none sees a child counted twice."""
        try:
            self.ledger.committed(await asyncio.to_thread(self.writer.write, batch))
        finally:
            self.ledger.release(len(batch))
