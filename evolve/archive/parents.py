"""What a prompt shows about its parent beyond the code: its evaluation's feedback, stderr, failed cases and the
errors its code raised into the evaluator's, and
its newest children (their code, and the errors of those that failed). The `Archive` facade hands these on.
Each is one query on an indexed column (`programs.parent_id`, `evaluations.program_id`)
bounded by a limit, so asking per group costs the same in an archive of any size.

A child the evaluator refused (its own checks: "points outside the unit square") or whose exception it swallowed
has no error kind: it scored the worst value on every component (`zero`, evolve/yields.py). Given the problem's
`Scale`, such children count among the failures too, with the evaluator's feedback and the errors their code raised
into it, so that the model reads why the attempt scored nothing instead of writing it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from evolve.archive.database import Database
from evolve.archive.models import Evaluation, Program
from evolve.archive.trees import resolve_codes
from evolve.yields import REFUSED, Scale


@dataclass(frozen=True)
class ParentContext:
    feedback: str | None
    stderr: str | None
    case_errors: dict[str, str] | None
    swallowed: list[dict[str, Any]] | None = None  # what its code raised into the evaluator's, most frequent first


@dataclass(frozen=True)
class ChildFailure:
    """How one of a parent's children failed: its error kind and message (a prompt shows the first lines). A
    refused child (`REFUSED`: a zero child) has the evaluator's feedback as its message, the errors its code raised
    into the evaluator's (most frequent first) and whether it scored exactly 0 on every component (`at_zero`, so a
    prompt can say "0" rather than "the worst value")."""

    kind: str
    error: str
    swallowed: list[dict[str, Any]] | None = None
    at_zero: bool = False


@dataclass(frozen=True)
class PromptReads:
    """Everything a group's prompt reads from the archive, in one call: the codes shown (parent and inspirations, by
    id), what the parent's evaluation said, and its newest children, failed and all."""

    codes: dict[int, str]
    context: ParentContext
    recent_failures: list[ChildFailure]
    recent: list[str]


class ParentReads:
    def __init__(self, db: Database) -> None:
        self.db = db

    def parent_context(self, program_id: int) -> ParentContext:
        """What a prompt shows about a parent beyond its code: feedback, stderr, failed cases, swallowed errors."""
        columns = (Evaluation.feedback, Evaluation.stderr, Evaluation.case_errors, Evaluation.swallowed)
        with self.db.session() as s:
            row = s.execute(select(*columns).where(Evaluation.program_id == program_id)).first()
        return ParentContext(*row) if row else ParentContext(None, None, None)

    def seed_first_calls(self, run_id: int) -> list[str]:
        """The first calls recorded while the run's seed (its first program with no parent) was evaluated: [] before
        it was, or where none was recorded. One indexed query (`programs.run_id`), read once a run."""
        q = (
            select(Evaluation.first_calls)
            .join(Program, Program.id == Evaluation.program_id)
            .where(Program.run_id == run_id, Program.parent_id.is_(None))
            .order_by(Program.id)
            .limit(1)
        )
        with self.db.session() as s:
            calls = s.execute(q).scalar()
        return [c for c in calls if isinstance(c, str)] if isinstance(calls, list) else []

    def recent_child_failures(self, parent_id: int, limit: int = 3, zero: Scale | None = None) -> list[ChildFailure]:
        """The newest failed children of a parent, how each failed (index on parent_id: no scan). With `zero` (the
        problem's directions and worst values), its refused children too: of its newest `limit` children evaluated
        without error, those `zero.is_zero`; newest first, `limit` in all."""
        q = (
            select(Program.id, Evaluation.error_kind, Evaluation.error)
            .join(Program, Program.id == Evaluation.program_id)
            .where(Program.parent_id == parent_id, Evaluation.error_kind.is_not(None))
            .order_by(Program.id.desc())
            .limit(limit)
        )
        with self.db.session() as s:
            failed = [(pid, ChildFailure(kind, error or "")) for pid, kind, error in s.execute(q)]
        if zero is None:
            return [f for _, f in failed]
        merged = sorted([*failed, *self._refused_children(parent_id, limit, zero)], key=lambda r: -r[0])
        return [f for _, f in merged[:limit]]

    def _refused_children(self, parent_id: int, limit: int, zero: Scale) -> list[tuple[int, ChildFailure]]:
        """Of a parent's newest `limit` children evaluated without error, the zero ones (by id): judged here, on
        the bounded rows, since the worst values are the problem's and the scores a JSON column."""
        columns = (Program.id, Evaluation.scores, Evaluation.feedback, Evaluation.swallowed)
        q = (
            select(*columns)
            .join(Program, Program.id == Evaluation.program_id)
            .where(Program.parent_id == parent_id, Evaluation.error_kind.is_(None))
            .order_by(Program.id.desc())
            .limit(limit)
        )
        with self.db.session() as s:
            rows = s.execute(q).all()
        return [
            (pid, ChildFailure(REFUSED, feedback or "", swallowed, all(float(v) == 0.0 for v in scores.values())))
            for pid, scores, feedback, swallowed in rows
            if zero.is_zero(scores)
        ]

    def recent_children(self, parent_id: int, limit: int = 2) -> list[str]:
        """The code of a parent's newest children, oldest first: what was already tried from it."""
        q = (
            select(Program.id, Program.code, Program.tree_length)
            .where(Program.parent_id == parent_id)
            .order_by(Program.id.desc())
            .limit(limit)
        )
        with self.db.session() as s:
            codes = resolve_codes(s, s.execute(q).all())
        return list(reversed(codes.values()))
