"""Evaluated children as the archive stores them: one program row with its typed evaluation record per result.

Kept apart from the commit stage so that what is stored of an outcome (which texts, cut to what length) has one
home.
"""

from __future__ import annotations

from collections.abc import Sequence

from evolve.archive.batch import NewProgram
from evolve.archive.records import EvaluationRecord
from evolve.children import EvaluationResult
from evolve.fitness import scalar_view
from evolve.problem.config import ComponentSpec

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
