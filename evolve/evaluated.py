"""Evaluated children as the archive stores them: one program row with its evaluation per result.

Kept apart from the loop so that what is stored of an outcome (which texts, cut to what length) has one home.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evolve.archive.batch import NewProgram
from evolve.fitness import scalar_view
from evolve.groups import Child
from evolve.problem.config import ComponentSpec
from evolve.problem.outcome import EvalOutcome

STORED_OUTPUT = 8 * 1024  # of a candidate's stdout (its head) and stderr (its tail, which holds the traceback)


def program_rows(
    components: Sequence[ComponentSpec], batch: Sequence[tuple[Child, EvalOutcome, Any, Any]]
) -> tuple[list[float], list[NewProgram]]:
    """Each result's scalar view, and the rows that store it: (child, outcome, started, finished) in, in order."""
    scalars = [scalar_view(components, outcome.scores) for _, outcome, _s, _f in batch]
    rows = [
        NewProgram(
            child.code,
            child.parent_id,
            child.island,
            child.generation,
            child.variant_id,
            dict(
                scores=outcome.scores,
                scalar=scalar,
                error_kind=outcome.error_kind,
                error=outcome.error,
                duration_s=outcome.duration_s,
                feedback=outcome.feedback,
                stages=outcome.stages,
                stdout=outcome.stdout[:STORED_OUTPUT],
                stderr=outcome.stderr[-STORED_OUTPUT:],
                sandbox=outcome.sandbox,
                case_errors=dict(outcome.case_errors) or None,
                started_at=started,
                finished_at=finished,
            ),
            child.digest,
        )
        for (child, outcome, started, finished), scalar in zip(batch, scalars, strict=True)
    ]
    return scalars, rows
