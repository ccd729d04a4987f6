"""What the report and the dashboard read from the archive: a few column-only queries per view, never a
program's code in bulk, each answered as records or plain columns.

The SQL lives here so that the report knows no table: it turns these columns into arrays and figures. Bulk reads
come back column-wise (one list per column) with timestamps as the database's text, because numpy parses 100k
of those in C where building datetimes row by row costs seconds; the report parses them (`queries.times`).
Columns may be absent or NULL in older archives; every reader here tolerates that.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import String, Text, cast, func, select

from evolve.archive.database import Database
from evolve.archive.models import Completion, Evaluation, PolicyVersion, Program, Prompt, Run, Variant
from evolve.archive.records import ProgramRecord, StoredEvaluation
from evolve.archive.trees import fill_code


def as_text(column: Any) -> Any:
    """A timestamp column read as text (see the module's docstring)."""
    return cast(column, String)


def _columns(rows: list[Any], width: int) -> list[list[Any]]:
    """Rows turned into `width` column lists (empty lists when there are no rows)."""
    return [list(c) for c in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


@dataclass(frozen=True)
class EvaluationTable:
    """Every evaluation of a run in commit order, one list per column; timestamps as stored text, each score
    vector as its stored JSON text (one json.loads over all of them beats a decoder per row)."""

    program_id: list[int]
    island: list[int]
    scalar: list[float | None]
    error_kind: list[str | None]
    evaluated_at: list[str | None]
    code_length: list[int]
    scores_json: list[str | None]


@dataclass(frozen=True)
class VariantTimes:
    """Every answer of every completion of a run: its parse status and when its completion was stored (text)."""

    status: list[str]
    completed_at: list[str | None]


@dataclass(frozen=True)
class TokenRows:
    """Every completion of a run: when it was stored, its token count (from the packed ids' length, 4 bytes a
    token), when its group's sampling began and how long it took (None in archives older than that telemetry)."""

    completed_at: list[str | None]
    tokens: list[int]
    started_at: list[str | None]
    generation_s: list[float | None]


@dataclass(frozen=True)
class VersionRow:
    """A policy version with its update statistics and the best scalar among the children it wrote."""

    id: int
    number: int
    created_at: datetime
    stats: dict[str, Any] | None
    best_child: float | None
    children: int


@dataclass(frozen=True)
class ProgramOrigin:
    """The answer that made a program: its slot and parse status, its completion and prompt, the policy version."""

    slot: int
    parse_status: str
    completion: str
    prompt: str
    policy_version: int | None


@dataclass(frozen=True)
class ProgramDetail:
    """What a lineage node opens: the program with its evaluation, its parent's text, where it came from."""

    program: ProgramRecord
    parent_code: str | None
    origin: ProgramOrigin | None


@dataclass(frozen=True)
class ExportRow:
    program_id: int
    parent_id: int | None
    island: int
    generation: int
    created_at: datetime
    evaluated_at: datetime
    duration_s: float
    policy_version: int | None
    parse_status: str | None
    error_kind: str | None
    scalar: float | None
    scores: dict[str, Any]


class ReportReads:
    def __init__(self, db: Database) -> None:
        self.db = db

    def evaluation_table(self, run_id: int) -> EvaluationTable:
        """One query, read as raw text (json_extract per component in SQL costs several times more at 100k)."""
        q = (
            select(
                Program.id,
                Program.island,
                Evaluation.scalar,
                Evaluation.error_kind,
                as_text(Evaluation.created_at),
                func.coalesce(Program.tree_length, func.length(Program.code)),
                cast(Evaluation.scores, Text),
            )
            .join(Evaluation, Evaluation.program_id == Program.id)
            .where(Program.run_id == run_id)
            .order_by(Evaluation.id)
        )
        with self.db.engine.connect() as conn:
            rows = conn.execute(q).all()
        return EvaluationTable(*_columns(rows, 7))

    def variant_times(self, run_id: int) -> VariantTimes:
        q = (
            select(Variant.status, as_text(Completion.created_at))
            .join(Completion, Completion.id == Variant.completion_id)
            .join(Prompt, Prompt.id == Completion.prompt_id)
            .where(Prompt.run_id == run_id)
        )
        with self.db.engine.connect() as conn:
            rows = conn.execute(q).all()
        return VariantTimes(*_columns(rows, 2))

    def valid_child_times(self, run_id: int) -> list[str | None]:
        """Completion times (text) of the answers that made a new child which evaluated without error."""
        q = (
            select(as_text(Completion.created_at))
            .join(Variant, Variant.completion_id == Completion.id)
            .join(Evaluation, Evaluation.program_id == Variant.program_id)
            .join(Prompt, Prompt.id == Completion.prompt_id)
            .where(Prompt.run_id == run_id, Variant.status == "ok", Evaluation.error_kind.is_(None))
        )
        with self.db.engine.connect() as conn:
            return list(conn.scalars(q))

    def token_rows(self, run_id: int) -> TokenRows:
        q = (
            select(
                as_text(Completion.created_at),
                func.coalesce(func.length(Completion.token_ids), 0) / 4,
                as_text(Prompt.started_at),
                Prompt.generation_s,
            )
            .join(Prompt, Prompt.id == Completion.prompt_id)
            .where(Prompt.run_id == run_id)
        )
        with self.db.engine.connect() as conn:
            rows = conn.execute(q).all()
        completed, tokens, started, seconds = _columns(rows, 4)
        return TokenRows(completed, [int(n) for n in tokens], started, seconds)

    def version_rows(self, run_id: int) -> list[VersionRow]:
        children = (
            select(
                Completion.policy_version_id,
                func.max(Evaluation.scalar).filter(Evaluation.error_kind.is_(None)),
                func.count(Variant.id),
            )
            .join(Variant, Variant.completion_id == Completion.id)
            .join(Evaluation, Evaluation.program_id == Variant.program_id)
            .where(Variant.status == "ok")
            .group_by(Completion.policy_version_id)
        )
        with self.db.session() as s:
            best = {vid: (value, n) for vid, value, n in s.execute(children)}
            versions = s.execute(
                select(PolicyVersion.id, PolicyVersion.number, PolicyVersion.created_at, PolicyVersion.stats)
                .where(PolicyVersion.run_id == run_id)
                .order_by(PolicyVersion.id)
            ).all()
        return [VersionRow(vid, num, at, stats, *best.get(vid, (None, 0))) for vid, num, at, stats in versions]

    def change_key(self, run_id: int) -> tuple[int | None, int | None, int | None, datetime | None]:
        """Cheap fingerprint of what the views read: it changes whenever the run commits something."""
        with self.db.session() as s:
            return (
                s.scalar(select(func.max(Evaluation.id))),
                s.scalar(select(func.max(Variant.id))),
                s.scalar(select(func.max(PolicyVersion.id))),
                s.scalar(select(Run.updated_at).where(Run.id == run_id)),
            )

    def program_detail(self, program_id: int) -> ProgramDetail | None:
        """The program with its evaluation, its parent's text, and the first answer that made it."""
        with self.db.session() as s:
            program = s.get(Program, program_id)
            if program is None:
                return None
            parent = s.get(Program, program.parent_id) if program.parent_id is not None else None
            fill_code(s, [program, parent])
            ev = program.evaluation
            origin = s.execute(
                select(Variant.slot, Variant.status, Completion.text, Prompt.text, PolicyVersion.number)
                .join(Completion, Completion.id == Variant.completion_id)
                .join(Prompt, Prompt.id == Completion.prompt_id)
                .outerjoin(PolicyVersion, PolicyVersion.id == Completion.policy_version_id)
                .where(Variant.program_id == program_id)
                .order_by(Variant.id)
                .limit(1)
            ).first()
            return ProgramDetail(
                ProgramRecord.of(program, None if ev is None else StoredEvaluation.of(ev)),
                parent.code if parent is not None else None,
                None if origin is None else ProgramOrigin(*origin),
            )

    def export_rows(self, run_id: int) -> list[ExportRow]:
        """One row per evaluation with its times and the policy version and parse status of the answer that
        made it. The answer that made a program is its first variant; later duplicates of it point at it too."""
        first_variant = (
            select(Variant.program_id, func.min(Variant.id).label("vid"))
            .where(Variant.program_id.is_not(None))
            .group_by(Variant.program_id)
            .subquery()
        )
        q = (
            select(
                Program.id,
                Program.parent_id,
                Program.island,
                Program.generation,
                Program.created_at,
                Evaluation.created_at,
                Evaluation.duration_s,
                PolicyVersion.number,
                Variant.status,
                Evaluation.error_kind,
                Evaluation.scalar,
                Evaluation.scores,
            )
            .join(Evaluation, Evaluation.program_id == Program.id)
            .outerjoin(first_variant, first_variant.c.program_id == Program.id)
            .outerjoin(Variant, Variant.id == first_variant.c.vid)
            .outerjoin(Completion, Completion.id == Variant.completion_id)
            .outerjoin(PolicyVersion, PolicyVersion.id == Completion.policy_version_id)
            .where(Program.run_id == run_id)
            .order_by(Program.id)
        )
        with self.db.session() as s:
            return [ExportRow(*row) for row in s.execute(q)]
