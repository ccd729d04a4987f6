"""The report's reads from the archive: a few column-only queries per view, never a program's code in bulk.

Telemetry the archive does not hold yet is derived: tokens from the packed `token_ids` blob length (4 bytes a
token), evaluation start from its commit time minus its duration. Columns may be absent or NULL in older
archives; every reader here tolerates that.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select

from evolve.archive.models import Completion, Evaluation, PolicyVersion, Program, Prompt, Run, Variant
from evolve.archive.store import Archive

TEXT_LIMIT = 20_000  # per text field of a program's detail: enough to read, bounded for the report's size


@dataclass(frozen=True)
class EvaluationRow:
    program_id: int
    parent_id: int | None
    island: int
    generation: int
    scores: dict[str, Any]
    scalar: float | None
    error_kind: str | None
    evaluated_at: datetime
    duration_s: float
    code_length: int


def evaluation_rows(archive: Archive, run_id: int) -> list[EvaluationRow]:
    """Every evaluation of a run in commit order (no code, no output text)."""
    q = (
        select(
            Program.id,
            Program.parent_id,
            Program.island,
            Program.generation,
            Evaluation.scores,
            Evaluation.scalar,
            Evaluation.error_kind,
            Evaluation.created_at,
            Evaluation.duration_s,
            func.length(Program.code),
        )
        .join(Evaluation, Evaluation.program_id == Program.id)
        .where(Program.run_id == run_id)
        .order_by(Evaluation.id)
    )
    with archive.session() as s:
        return [EvaluationRow(*row) for row in s.execute(q)]


def variant_rows(archive: Archive, run_id: int) -> list[tuple[str, datetime]]:
    """(parse status, completion time) of every answer of every completion of the run."""
    q = (
        select(Variant.status, Completion.created_at)
        .join(Completion, Completion.id == Variant.completion_id)
        .join(Prompt, Prompt.id == Completion.prompt_id)
        .where(Prompt.run_id == run_id)
    )
    with archive.session() as s:
        return [(status, at) for status, at in s.execute(q)]


def completion_rows(archive: Archive, run_id: int) -> list[tuple[datetime, int]]:
    """(time, tokens) per completion; tokens from the packed int32 ids, 0 where the backend gave none."""
    q = (
        select(Completion.created_at, func.coalesce(func.length(Completion.token_ids), 0) / 4)
        .join(Prompt, Prompt.id == Completion.prompt_id)
        .where(Prompt.run_id == run_id)
    )
    with archive.session() as s:
        return [(at, int(n)) for at, n in s.execute(q)]


def valid_child_times(archive: Archive, run_id: int) -> list[datetime]:
    """Completion times of the answers that made a new child which evaluated without error."""
    q = (
        select(Completion.created_at)
        .join(Variant, Variant.completion_id == Completion.id)
        .join(Evaluation, Evaluation.program_id == Variant.program_id)
        .join(Prompt, Prompt.id == Completion.prompt_id)
        .where(Prompt.run_id == run_id, Variant.status == "ok", Evaluation.error_kind.is_(None))
    )
    with archive.session() as s:
        return list(s.scalars(q))


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


@dataclass(frozen=True)
class Node:
    id: int
    parent_id: int | None
    generation: int
    island: int
    scalar: float | None


def ancestry(archive: Archive, program_ids: list[int], limit: int = 200) -> list[Node]:
    """The union of the ancestor chains of `program_ids` (each walked at most `limit` steps), as one tree."""
    nodes: dict[int, Node] = {}
    frontier = [pid for pid in program_ids if pid is not None]
    steps = 0
    with archive.session() as s:
        while frontier and steps <= limit:
            rows = s.execute(
                select(Program.id, Program.parent_id, Program.generation, Program.island, Evaluation.scalar)
                .outerjoin(Evaluation, Evaluation.program_id == Program.id)
                .where(Program.id.in_(frontier))
            ).all()
            for row in rows:
                nodes[row[0]] = Node(*row)
            frontier = sorted({r[1] for r in rows if r[1] is not None and r[1] not in nodes})
            steps += 1
    return sorted(nodes.values(), key=lambda n: n.id)


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
        parent_code = None
        if program.parent_id is not None:
            parent_code = s.scalar(select(Program.code).where(Program.id == program.parent_id))
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
            lines = difflib.unified_diff(
                parent_code.splitlines(), program.code.splitlines(), f"program {program.parent_id}",
                f"program {program.id}", lineterm="",
            )
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
            Program.id, Program.parent_id, Program.island, Program.generation, Program.created_at,
            Evaluation.created_at, Evaluation.duration_s, PolicyVersion.number, Variant.status,
            Evaluation.error_kind, Evaluation.scalar, Evaluation.scores,
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
