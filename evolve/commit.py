"""The commit stage: scored children become program rows (program and evaluation in one transaction, a batch at a
time; `stored_program` is the one home of what is stored of an outcome). What became of each comes back as a
`StoredChild`, which the loop applies to the run's ledger (population, counters, stop rules).
"""

from __future__ import annotations

from collections.abc import Sequence

from evolve.archive import Archive
from evolve.archive.batch import NewProgram
from evolve.archive.records import EvaluationRecord
from evolve.fitness import scalar_view
from evolve.handoffs import EvaluationResult, ScoredRun, StoredChild
from evolve.problem import Problem
from evolve.problem.config import ComponentSpec

COMMIT_BATCH = 64  # results written in one transaction at most
STORED_OUTPUT = 8 * 1024  # of a candidate's stdout (its head) and stderr (its tail, which holds the traceback)


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
        swallowed=[e.as_dict() for e in outcome.swallowed] or None,
        # The seed's alone: another program's reply is the candidate's to write (sandboxes/first_calls.py)
        first_calls=(outcome.first_calls or None) if child.parent_id is None else None,
        started_at=result.started_at,
        finished_at=result.finished_at,
    )
    return NewProgram(
        child.code, child.parent_id, child.island, child.generation, child.variant_id, record, digest=child.digest
    )


class ProgramWriter:
    """Writes scored children as program rows, a batch in one transaction (on a worker thread), and reads a run's
    programs back for the ledger at the start of a session. It holds no run state."""

    def __init__(self, problem: Problem, archive: Archive, run_id: int) -> None:
        self.problem, self.archive, self.run_id = problem, archive, run_id

    def replay(self) -> ScoredRun:
        """The run's scored programs, its code index (a run stored by an earlier normalisation hashed as now) and
        its groups."""
        rows = self.archive.scored_programs(self.run_id)
        self.archive.upgrade_code_hashes(self.run_id, self.problem.multi_file)
        return ScoredRun(rows, self.archive.code_hashes(self.run_id), self.archive.group_outcomes(self.run_id))

    def write(self, batch: Sequence[EvaluationResult]) -> list[StoredChild]:
        """The rows (built here, off the event loop) and what became of each once the batch is committed."""
        rows = [stored_program(self.problem.components, result) for result in batch]
        written = self.archive.add_evaluated_programs(self.run_id, rows, self.problem.multi_file)
        return [
            StoredChild(result.child, result.outcome, row.evaluation.scalar or 0.0, stored.program_id, stored.created)
            for result, row, stored in zip(batch, rows, written, strict=True)
        ]
