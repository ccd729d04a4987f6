"""The one lineage walker: ancestor chains read a generation at a time, for the CLI and the report alike.

Each step is one query on the primary key for the whole frontier, so a report drawing the ancestry of a
hundred best programs costs as many queries as the deepest chain is long, not one per program.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from evolve.archive.models import Evaluation, Program


@dataclass(frozen=True)
class LineageNode:
    id: int
    parent_id: int | None
    generation: int
    island: int
    scalar: float | None  # None where the program has no evaluation, or failed to get one


def ancestry(session: Session, program_ids: Iterable[int | None], steps: int) -> list[LineageNode]:
    """The union of the ancestor chains of `program_ids`, each walked at most `steps` parents up, by id."""
    nodes: dict[int, LineageNode] = {}
    frontier = sorted({pid for pid in program_ids if pid is not None})
    walked = 0
    while frontier and walked <= steps:
        rows = session.execute(
            select(Program.id, Program.parent_id, Program.generation, Program.island, Evaluation.scalar)
            .outerjoin(Evaluation, Evaluation.program_id == Program.id)
            .where(Program.id.in_(frontier))
        ).all()
        for row in rows:
            nodes[row[0]] = LineageNode(*row)
        frontier = sorted({r[1] for r in rows if r[1] is not None and r[1] not in nodes})
        walked += 1
    return sorted(nodes.values(), key=lambda n: n.id)


def chain(nodes: Iterable[LineageNode], program_id: int) -> list[LineageNode]:
    """The program, its parent, and so on, as far as `nodes` reach."""
    by_id = {n.id: n for n in nodes}
    out: list[LineageNode] = []
    current = by_id.get(program_id)
    while current is not None:
        out.append(current)
        current = by_id.get(current.parent_id) if current.parent_id is not None else None
    return out
