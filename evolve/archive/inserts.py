"""Multi-row writes through SQLAlchemy Core: a stored group and its variants in a handful of statements.

The loop writes every group and every result; through the ORM's unit of work (one flush and one object per
row) those writes cost the engine more CPU than everything else a child needs, and the engine's one writer
became the ceiling of a run fed by a cluster. Core statements with many parameter sets skip that bookkeeping;
the rows, their defaults and their transaction are the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Table, insert, select

from evolve.archive.models import Completion, Prompt, Variant
from evolve.archive.packed import pack_floats, pack_ints

PROMPTS: Table = Prompt.__table__  # type: ignore[assignment]
COMPLETIONS: Table = Completion.__table__  # type: ignore[assignment]
VARIANTS: Table = Variant.__table__  # type: ignore[assignment]


@dataclass(frozen=True)
class GroupTelemetry:
    """How one group was sampled: tokens, seconds, when it began, and its variants' parse outcomes."""

    tokens: int | None = None
    generation_s: float | None = None
    started_at: Any = None  # datetime (naive UTC)
    parse_counts: dict[str, int] | None = None
    member: str | None = None  # the ensemble member that sampled the group
    ask: str | None = None  # the ask arm it was sampled with


@dataclass(frozen=True)
class CompletionRecord:
    text: str
    token_ids: list[int] | None
    logprobs: list[float] | None
    finish_reason: str | None
    policy_version_id: int | None


def insert_returning_ids(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> list[int]:
    """Insert rows and return their new ids in the rows' order: one multi-row statement where the dialect can
    say which id belongs to which row, else one statement a row."""
    if not rows:
        return []
    if conn.dialect.insert_executemany_returning_sort_by_parameter_order:
        stmt = insert(table).returning(table.c.id, sort_by_parameter_order=True)
        return list(conn.execute(stmt, rows).scalars())
    return [conn.execute(insert(table).values(**row)).inserted_primary_key[0] for row in rows]


def write_group(
    conn: Connection,
    run_id: int,
    *,
    parent_id: int,
    inspiration_ids: list[int],
    island: int,
    prompt: str,
    sampling: dict[str, Any],
    completions: Sequence[CompletionRecord],
    variants: Sequence[Sequence[tuple[str, str | None, int | None]]],
    telemetry: GroupTelemetry,
) -> list[list[int]]:
    """Insert a prompt, its completions and their variants; returns the variant ids by completion and slot."""
    t = telemetry
    [prompt_id] = insert_returning_ids(
        conn,
        PROMPTS,
        [
            dict(
                run_id=run_id,
                parent_id=parent_id,
                inspiration_ids=inspiration_ids,
                island=island,
                text=prompt,
                tokens=t.tokens,
                generation_s=t.generation_s,
                parse_counts=t.parse_counts,
                started_at=t.started_at,
                member=t.member,
                ask=t.ask,
            )
        ],
    )
    completion_ids = insert_returning_ids(
        conn,
        COMPLETIONS,
        [
            dict(
                prompt_id=prompt_id,
                policy_version_id=record.policy_version_id,
                sampling=sampling,
                text=record.text,
                token_ids=pack_ints(record.token_ids),
                logprobs=pack_floats(record.logprobs),
                finish_reason=record.finish_reason,
            )
            for record in completions
        ],
    )
    rows = [
        dict(completion_id=cid, slot=k, status=status, detail=detail, program_id=pid)
        for cid, slots in zip(completion_ids, variants, strict=True)
        for k, (status, detail, pid) in enumerate(slots)
    ]
    if rows:
        conn.execute(insert(VARIANTS), rows)
    ids = {  # read back by (completion, slot): one query, whatever the dialect can return from a batch insert
        (cid, slot): vid
        for vid, cid, slot in conn.execute(
            select(VARIANTS.c.id, VARIANTS.c.completion_id, VARIANTS.c.slot).where(
                VARIANTS.c.completion_id.in_(completion_ids)
            )
        )
    }
    return [[ids[cid, k] for k in range(len(slots))] for cid, slots in zip(completion_ids, variants, strict=True)]
