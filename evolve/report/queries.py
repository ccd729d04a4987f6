"""The report's reads from the archive: a few column-only queries per view, never a program's code in bulk.

Telemetry the archive does not hold yet is derived: tokens from the packed `token_ids` blob length (4 bytes a
token), evaluation start from its commit time minus its duration. Columns may be absent or NULL in older
archives; every reader here tolerates that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import String, Text, cast, func, select

from evolve.archive import Archive
from evolve.archive.models import Completion, Evaluation, PolicyVersion, Program, Prompt, Run, Variant
from evolve.archive.trees import fill_code
from evolve.filetree import program_diff

TEXT_LIMIT = 20_000  # per text field of a program's detail: enough to read, bounded for the report's size


def as_text(column: Any) -> Any:
    """A timestamp column read as text: numpy parses 100k of them in C, SQLAlchemy would build datetimes."""
    return cast(column, String)


def times(values: list[str | None]) -> np.ndarray:
    return np.array([v or "NaT" for v in values], dtype="datetime64[us]")


@dataclass(frozen=True)
class EvaluationColumns:
    """Every evaluation of a run in commit order, column-wise; scores as an (N, D) matrix, NaN where absent."""

    program_id: np.ndarray
    island: np.ndarray
    scalar: np.ndarray  # NaN for failed evaluations
    error_kind: list[str | None]
    evaluated_at: np.ndarray  # datetime64[us]
    code_length: np.ndarray
    scores: np.ndarray


def score_matrix(vectors: list[dict[str, Any]], names: list[str]) -> np.ndarray:
    """(N, D) floats, NaN where a component is missing. Vectors whose keys are exactly `names` in order (what
    evaluators return) are taken whole; only the others are looked up name by name."""
    order = tuple(names)
    nan = float("nan")
    rows = [list(v.values()) if tuple(v) == order else [v.get(n, nan) for n in names] for v in vectors]
    return np.array(rows, dtype=float).reshape(len(vectors), len(names))


def evaluation_columns(archive: Archive, run_id: int, names: list[str]) -> EvaluationColumns:
    """One query, read as raw text: the score vectors are decoded by one json.loads over all rows (a
    per-row decoder, or json_extract per component in SQL, costs several times more at 100k rows)."""
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
    with archive.engine.connect() as conn:
        rows = conn.execute(q).all()
    failed = [r[3] is not None or r[2] is None for r in rows]
    vectors = json.loads("[" + ",".join(r[6] or "{}" for r in rows) + "]")
    matrix = score_matrix(vectors, names)
    matrix[np.array(failed, dtype=bool)] = np.nan
    return EvaluationColumns(
        program_id=np.array([r[0] for r in rows], dtype=np.int64),
        island=np.array([r[1] for r in rows], dtype=np.int64),
        scalar=np.array([np.nan if f else r[2] for r, f in zip(rows, failed, strict=True)], dtype=float),
        error_kind=[r[3] for r in rows],
        evaluated_at=times([r[4] for r in rows]),
        code_length=np.array([r[5] for r in rows], dtype=np.int64),
        scores=matrix,
    )


def variant_rows(archive: Archive, run_id: int) -> tuple[list[str], np.ndarray]:
    """Parse status and completion time of every answer of every completion of the run."""
    q = (
        select(Variant.status, as_text(Completion.created_at))
        .join(Completion, Completion.id == Variant.completion_id)
        .join(Prompt, Prompt.id == Completion.prompt_id)
        .where(Prompt.run_id == run_id)
    )
    with archive.engine.connect() as conn:
        rows = conn.execute(q).all()
    return [r[0] for r in rows], times([r[1] for r in rows])


def valid_child_times(archive: Archive, run_id: int) -> np.ndarray:
    """Completion times of the answers that made a new child which evaluated without error."""
    q = (
        select(as_text(Completion.created_at))
        .join(Variant, Variant.completion_id == Completion.id)
        .join(Evaluation, Evaluation.program_id == Variant.program_id)
        .join(Prompt, Prompt.id == Completion.prompt_id)
        .where(Prompt.run_id == run_id, Variant.status == "ok", Evaluation.error_kind.is_(None))
    )
    with archive.engine.connect() as conn:
        return times(list(conn.scalars(q)))


@dataclass(frozen=True)
class VersionRow:
    id: int
    number: int
    created_at: datetime
    stats: dict[str, Any] | None
    best_child: float | None
    children: int


def version_rows(archive: Archive, run_id: int) -> list[VersionRow]:
    """Each policy version with its update statistics and the best scalar among the children it wrote."""
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
    with archive.session() as s:
        best = {vid: (value, n) for vid, value, n in s.execute(children)}
        versions = s.execute(
            select(PolicyVersion.id, PolicyVersion.number, PolicyVersion.created_at, PolicyVersion.stats)
            .where(PolicyVersion.run_id == run_id)
            .order_by(PolicyVersion.id)
        ).all()
    return [VersionRow(vid, num, at, stats, *best.get(vid, (None, 0))) for vid, num, at, stats in versions]


def change_key(archive: Archive, run_id: int) -> tuple[Any, ...]:
    """Cheap fingerprint of what the views read: it changes whenever the run commits something."""
    with archive.session() as s:
        return (
            s.scalar(select(func.max(Evaluation.id))),
            s.scalar(select(func.max(Variant.id))),
            s.scalar(select(func.max(PolicyVersion.id))),
            s.scalar(select(Run.updated_at).where(Run.id == run_id)),
        )


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= TEXT_LIMIT:
        return text
    return text[:TEXT_LIMIT] + f"\n... [{len(text) - TEXT_LIMIT} more characters in the archive]"


def program_detail(archive: Archive, program_id: int) -> dict[str, Any] | None:
    """What a lineage node opens: code, diff against the parent, scores, feedback, errors, prompt, completion."""
    with archive.session() as s:
        program = s.get(Program, program_id)
        if program is None:
            return None
        ev = s.scalar(select(Evaluation).where(Evaluation.program_id == program_id))
        parent = s.get(Program, program.parent_id) if program.parent_id is not None else None
        fill_code(s, [program, parent])
        parent_code = parent.code if parent is not None else None
        origin = s.execute(
            select(Variant.slot, Variant.status, Completion.text, Prompt.text, PolicyVersion.number)
            .join(Completion, Completion.id == Variant.completion_id)
            .join(Prompt, Prompt.id == Completion.prompt_id)
            .outerjoin(PolicyVersion, PolicyVersion.id == Completion.policy_version_id)
            .where(Variant.program_id == program_id)
            .order_by(Variant.id)
            .limit(1)
        ).first()
        diff = None
        if parent_code is not None:
            lines = program_diff(parent_code, program.code, f"program {program.parent_id}", f"program {program.id}")
            diff = "\n".join(lines)
        return {
            "id": program.id,
            "parent_id": program.parent_id,
            "island": program.island,
            "generation": program.generation,
            "created_at": program.created_at.isoformat(),
            "code": _clip(program.code),
            "diff": _clip(diff),
            "scores": ev.scores if ev else None,
            "scalar": ev.scalar if ev else None,
            "error_kind": ev.error_kind if ev else None,
            "error": _clip(ev.error) if ev else None,
            "feedback": _clip(ev.feedback) if ev else None,
            "stdout": _clip(ev.stdout) if ev else None,
            "stderr": _clip(ev.stderr) if ev else None,
            "duration_s": ev.duration_s if ev else None,
            "slot": origin[0] if origin else None,
            "parse_status": origin[1] if origin else None,
            "completion": _clip(origin[2]) if origin else None,
            "prompt": _clip(origin[3]) if origin else None,
            "policy_version": origin[4] if origin else None,
        }


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


def export_rows(archive: Archive, run_id: int) -> list[ExportRow]:
    """One row per evaluation with its times and the policy version and parse status of the answer that made it.

    The answer that made a program is its first variant; later duplicates of it point at it too.
    """
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
    with archive.session() as s:
        return [ExportRow(*row) for row in s.execute(q)]
