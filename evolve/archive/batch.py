"""Commit many evaluated programs in one transaction: what lets one committer keep up with a cluster.

One transaction per evaluation caps a run at a few hundred evaluations per second (each commit is a
round trip and, on a server database, a WAL flush). Results that land together are written together; a kill
loses only the batch not yet committed, whose variants stay pending and are evaluated again on resume.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from evolve.archive.codehash import code_hash
from evolve.archive.models import Evaluation, Program, Variant
from evolve.archive.store import Archive


@dataclass(frozen=True)
class NewProgram:
    code: str
    parent_id: int | None
    island: int
    generation: int
    variant_id: int | None
    evaluation: dict[str, Any]
    digest: str | None = None  # the normalised-code hash when the caller has it already (it costs a parse)


def add_evaluated_programs(archive: Archive, run_id: int, items: Sequence[NewProgram]) -> list[tuple[int, bool]]:
    """Insert programs with their evaluations in one transaction; returns (id, created) per item, in order.

    A program whose normalised code is already in the run (or earlier in the batch) is not inserted; its
    variant is marked a duplicate of the existing program, as `Archive.add_evaluated_program` does.
    """
    if len(items) == 1:
        item = items[0]
        return [
            archive.add_evaluated_program(
                run_id,
                item.code,
                parent_id=item.parent_id,
                island=item.island,
                generation=item.generation,
                evaluation=item.evaluation,
                variant_id=item.variant_id,
            )
        ]
    digests = [item.digest or code_hash(item.code) for item in items]
    try:
        with archive.session() as s:
            known = dict(
                s.execute(
                    select(Program.code_hash, Program.id).where(
                        Program.run_id == run_id, Program.code_hash.in_(set(digests))
                    )
                ).all()
            )
            results: list[tuple[int, bool]] = []
            for item, digest in zip(items, digests, strict=True):
                if digest in known:
                    results.append((known[digest], False))
                    if item.variant_id is not None:
                        s.execute(
                            update(Variant)
                            .where(Variant.id == item.variant_id)
                            .values(status="duplicate", program_id=known[digest])
                        )
                    continue
                program = Program(
                    run_id=run_id,
                    code=item.code,
                    code_hash=digest,
                    parent_id=item.parent_id,
                    island=item.island,
                    generation=item.generation,
                )
                s.add(program)
                s.flush()
                s.add(Evaluation(program_id=program.id, **item.evaluation))
                if item.variant_id is not None:
                    s.execute(update(Variant).where(Variant.id == item.variant_id).values(program_id=program.id))
                known[digest] = program.id
                results.append((program.id, True))
            return results
    except IntegrityError:  # another writer inserted one of these meanwhile: fall back to one at a time
        return [add_evaluated_programs(archive, run_id, [item])[0] for item in items]
