"""The commit stage: the engine's one writer. Scored children become program rows (program and evaluation in one
transaction, a batch at a time; `stored_program` is the one home of what is stored of an outcome), then members of
the population; the stop rules that read the scores (target, patience, solved, the evaluation budget) are checked
here, as each result lands.

The write runs on a worker thread; the population, the code index and the stats change on the event loop, where
selection and the stop rules read them, never beside a writer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from evolve.archive import Archive
from evolve.archive.batch import NewProgram
from evolve.archive.records import EvaluationRecord, StoredProgram
from evolve.children import Child, EvaluationResult, KnownCode
from evolve.control import Incidents, RunControl, StageFailure
from evolve.fitness import oriented_by_name, raw_scores, scalar_view, solved
from evolve.problem import Problem
from evolve.problem.config import ComponentSpec
from evolve.runs import RunOptions
from evolve.selection import Member, Population
from evolve.stats import LoopStats
from evolve.stopping import Patience

COMMIT_BATCH = 64  # results written in one transaction at most
STORED_OUTPUT = 8 * 1024  # of a candidate's stdout (its head) and stderr (its tail, which holds the traceback)

# Told of each new child evaluated without error: (child, its scalar, its program id, whether it is the run's new
# best); the ensemble credits the member and ask that wrote it.
ValidChild = Callable[[Child, float, int, bool], None]


def stored_program(components: Sequence[ComponentSpec], result: EvaluationResult) -> NewProgram:
    """The program row of one result, with its evaluation and the scalar view the population ranks it by."""
    child, outcome = result.child, result.outcome
    record = EvaluationRecord(
        scores=outcome.scores,
        scalar=scalar_view(components, outcome.scores),
        error_kind=outcome.error_kind,
        error=outcome.error,
        duration_s=outcome.duration_s,
        build_s=outcome.build_s,
        sandbox=outcome.sandbox,
        feedback=outcome.feedback,
        stages=outcome.stages,
        stdout=outcome.stdout[:STORED_OUTPUT],
        stderr=outcome.stderr[-STORED_OUTPUT:],
        case_errors=dict(outcome.case_errors) or None,
        started_at=result.started_at,
        finished_at=result.finished_at,
    )
    return NewProgram(
        child.code, child.parent_id, child.island, child.generation, child.variant_id, record, digest=child.digest
    )


class CommitStage:
    def __init__(
        self,
        problem: Problem,
        archive: Archive,
        run_id: int,
        options: RunOptions,
        population: Population,
        stats: LoopStats,
        known: KnownCode,
        control: RunControl,
        incidents: Incidents,
        on_valid: ValidChild | None = None,
    ) -> None:
        self.problem, self.archive, self.run_id, self.options = problem, archive, run_id, options
        self.population, self.stats, self.known = population, stats, known
        self.control, self.incidents, self.on_valid = control, incidents, on_valid
        self.patience = Patience(options.patience)
        self.results: asyncio.Queue[EvaluationResult] = asyncio.Queue()
        self.backlog = 0  # results submitted and not yet committed (or given up)

    def rebuild(self) -> None:
        """Replay the archive into the population, the code index, the stats and the budget (at start only)."""
        for row in self.archive.scored_programs(self.run_id):
            ok = row.error_kind is None and row.scalar is not None
            member = self.population.member(
                row.id, row.island, row.generation, row.scores, row.scalar or 0.0, row.code_length
            )
            self.population.add(member if ok else None)
            self._count(member, row.error_kind)
        self.archive.upgrade_code_hashes(self.run_id)  # a run stored by an earlier normalisation: hashed as now
        self.known.load(self.archive.code_hashes(self.run_id))
        self.control.start_from(self.stats.evaluations)

    async def submit(self, result: EvaluationResult) -> None:
        self.backlog += 1
        await self.results.put(result)

    async def drained(self) -> None:
        """Every submitted result was committed (or given up)."""
        await self.results.join()

    async def work(self) -> None:
        """Whatever results have landed are committed together, one transaction a batch. A failed batch costs
        these children (left pending, their evaluations given back); a broken archive repeats and stops the run."""
        while True:
            batch = [await self.results.get()]
            while len(batch) < COMMIT_BATCH and not self.results.empty():
                batch.append(self.results.get_nowait())
            try:
                await self.commit(batch)
                self.incidents.ok("commit")
            except Exception as exc:
                self.control.release(len(batch))
                self.incidents.record(StageFailure("commit", exc))
            finally:
                self.backlog -= len(batch)
                for _ in batch:
                    self.results.task_done()

    async def commit(self, batch: list[EvaluationResult]) -> None:
        """Write the batch on a worker thread, then update the index, population and stats here, on the loop."""
        rows, written = await asyncio.to_thread(self._write, batch)
        for result, row, stored in zip(batch, rows, written, strict=True):
            self.known.stored(result.child.digest, stored.program_id)
            self._record(result, row.evaluation.scalar or 0.0, stored)

    def _write(self, batch: list[EvaluationResult]) -> tuple[list[NewProgram], list[StoredProgram]]:
        """The rows (built here, off the event loop) and what became of each once the batch is committed."""
        rows = [stored_program(self.problem.components, result) for result in batch]
        return rows, self.archive.add_evaluated_programs(self.run_id, rows)

    def _record(self, result: EvaluationResult, scalar: float, stored: StoredProgram) -> None:
        child, outcome = result.child, result.outcome
        if not stored.created:
            self.control.release()
            return
        member = self.population.member(
            stored.program_id, child.island, child.generation, outcome.scores, scalar, len(child.code)
        )
        self.population.add(member if outcome.ok else None)
        self.stats.session_evaluations += 1
        if outcome.ok and child.parent_id is not None:
            self.stats.new_valid += 1
        best_before = self.stats.best_scalar
        self._count(member, outcome.error_kind)
        if self.on_valid is not None and outcome.ok and child.parent_id is not None:
            self.on_valid(child, scalar, stored.program_id, best_before is not None and scalar > best_before)
        if outcome.error_kind:
            self.stats.errors[outcome.error_kind] += 1
        target = self.options.target
        if target is not None and self.stats.best_scalar is not None and self.stats.best_scalar >= target:
            self.control.finish(f"target {target} reached")
            self.control.cut_sampling()
        if self.patience.exhausted(self.stats.evaluations):
            self.control.finish(f"patience: no new best scalar in {self.options.patience} evaluations")
        self.control.counted(self.stats.evaluations)

    def _count(self, member: Member, error_kind: str | None) -> None:
        self.stats.evaluations += 1
        if error_kind is None:
            self.stats.record_best(member.id, member.scalar, oriented_by_name(self.problem.components, member.oriented))
            self.patience.observe(self.stats.evaluations, member.scalar)
            components = self.problem.components
            if self.options.stop_when_solved and solved(components, raw_scores(components, member.oriented)):
                self.control.finish("solved: every component reached its best declared bound")
                self.control.cut_sampling()
        self.stats.island_sizes = [isl.size for isl in self.population.islands]
