"""What a prompt shows about its parent beyond the code: its evaluation's feedback, stderr, failed cases and the
errors its code raised into the evaluator's, and
its newest children (their code, and the errors of those that failed). The `Archive` facade hands these on.
Each is one query on an indexed column (`programs.parent_id`, `evaluations.program_id`)
bounded by a limit, so asking per group costs the same in an archive of any size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from evolve.archive.database import Database
from evolve.archive.models import Evaluation, Program
from evolve.archive.trees import resolve_codes


@dataclass(frozen=True)
class ParentContext:
    feedback: str | None
    stderr: str | None
    case_errors: dict[str, str] | None
    swallowed: list[dict[str, Any]] | None = None  # what its code raised into the evaluator's, most frequent first


@dataclass(frozen=True)
class ChildFailure:
    """How one of a parent's children failed: its error kind and message (a prompt shows the first lines)."""

    kind: str
    error: str


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

    def recent_child_failures(self, parent_id: int, limit: int = 3) -> list[ChildFailure]:
        """The newest failed children of a parent, how each failed (index on parent_id: no scan)."""
        q = (
            select(Evaluation.error_kind, Evaluation.error)
            .join(Program, Program.id == Evaluation.program_id)
            .where(Program.parent_id == parent_id, Evaluation.error_kind.is_not(None))
            .order_by(Program.id.desc())
            .limit(limit)
        )
        with self.db.session() as s:
            return [ChildFailure(kind, error or "") for kind, error in s.execute(q)]

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
