"""Commit many evaluated programs in one transaction: what lets one committer keep up with a cluster.

One transaction per evaluation caps a run at a few hundred evaluations per second (each commit is a
round trip and, on a server database, a WAL flush). Results that land together are written together; a kill
loses only the batch not yet committed, whose variants stay pending and are evaluated again on resume.

The rows go in through SQLAlchemy Core (multi-row INSERT ... RETURNING where the database has it), not the
ORM's unit of work: the committer is the engine's one writer, and the ORM's per-object bookkeeping cost more
than everything else a child costs the engine put together. It is the archive's only way to store a program.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, Table, bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError

from evolve.archive.codehash import code_hash
from evolve.archive.inserts import insert_returning_ids
from evolve.archive.models import Evaluation, Program, Variant
from evolve.archive.records import EvaluationRecord, StoredProgram
from evolve.archive.trees import store_trees, stored_files

PROGRAMS: Table = Program.__table__  # type: ignore[assignment]
EVALUATIONS: Table = Evaluation.__table__  # type: ignore[assignment]
VARIANTS: Table = Variant.__table__  # type: ignore[assignment]


@dataclass(frozen=True)
class NewProgram:
    """A program to insert with its evaluation; the variant it came from is linked to it (or to its twin)."""

    code: str
    parent_id: int | None
    island: int
    generation: int
    variant_id: int | None
    evaluation: EvaluationRecord
    digest: str | None = None  # the normalised-code hash when the caller has it already (it costs a parse)


def _insert_programs(conn: Connection, rows: list[dict[str, Any]]) -> dict[str, int]:
    """Insert program rows (distinct hashes); returns hash → new id. The hash, unique in a run, says which id
    is whose, so one multi-row INSERT ... RETURNING serves even where the database returns rows in any order."""
    if not rows:
        return {}
    if conn.dialect.insert_executemany_returning:
        stmt = insert(PROGRAMS).returning(PROGRAMS.c.code_hash, PROGRAMS.c.id)
        return dict(conn.execute(stmt, rows).all())  # type: ignore[arg-type]
    ids = insert_returning_ids(conn, PROGRAMS, rows)
    return {row["code_hash"]: pid for row, pid in zip(rows, ids, strict=True)}


def _evaluation_rows(items: Sequence[NewProgram], program_ids: list[int]) -> list[dict[str, Any]]:
    """One parameter set per evaluation; a typed record gives every row the same keys, as a multi-row statement
    needs."""
    return [{**item.evaluation.columns(), "program_id": pid} for item, pid in zip(items, program_ids, strict=True)]


def add_evaluated_programs(
    engine: Engine, run_id: int, items: Sequence[NewProgram], multi_file: bool = False
) -> list[StoredProgram]:
    """Insert programs with their evaluations in one transaction; returns what became of each item, in order.
    `multi_file`: the run's problem is one of several files, whose programs are stored as files (trees.py).

    A program whose normalised code is already in the run (or earlier in the batch) is not inserted; its
    variant is marked a duplicate of the existing program. When another writer commits one of these programs
    between our look-up and our insert, the insert fails on the unique code hash and the whole batch is
    tried again: the other writer's program is then found, so its id comes back and our copy is a duplicate.
    """
    if not items:
        return []
    digests = [item.digest or code_hash(item.code, multi_file) for item in items]
    while True:
        known_before = -1
        try:
            with engine.begin() as conn:
                known = _known_programs(conn, run_id, digests)
                known_before = len(known)
                return _insert_batch(conn, run_id, items, digests, known, multi_file)
        except IntegrityError:
            with engine.connect() as conn:
                known_now = len(_known_programs(conn, run_id, digests))
            if known_now <= known_before:
                raise  # no other writer brought one of these programs: a real constraint violation


def _known_programs(conn: Connection, run_id: int, digests: list[str]) -> dict[str, int]:
    """hash → id of the programs of the run among `digests`."""
    rows = conn.execute(
        select(PROGRAMS.c.code_hash, PROGRAMS.c.id).where(
            PROGRAMS.c.run_id == run_id, PROGRAMS.c.code_hash.in_(set(digests))
        )
    )
    return dict(rows.all())  # type: ignore[arg-type]


def _insert_batch(
    conn: Connection,
    run_id: int,
    items: Sequence[NewProgram],
    digests: list[str],
    known: dict[str, int],
    multi_file: bool,
) -> list[StoredProgram]:
    fresh: dict[str, int] = {}  # digest → index of the first item that brings it
    for index, digest in enumerate(digests):
        if digest not in known and digest not in fresh:
            fresh[digest] = index
    new = [items[i] for i in fresh.values()]
    trees = [stored_files(item.code, multi_file) for item in new]  # a program of several files: as its files
    created = _insert_programs(
        conn,
        [
            dict(
                run_id=run_id,
                code="" if files is not None else item.code,
                tree_length=len(item.code) if files is not None else None,
                code_hash=digest,
                parent_id=item.parent_id,
                island=item.island,
                generation=item.generation,
            )
            for item, digest, files in zip(new, fresh, trees, strict=True)
        ],
    )
    store_trees(conn, [(created[d], files) for d, files in zip(fresh, trees, strict=True) if files is not None])
    if new:
        conn.execute(insert(EVALUATIONS), _evaluation_rows(new, [created[digest] for digest in fresh]))
    results: list[StoredProgram] = []
    made: list[dict[str, int]] = []  # variants whose child is a new program
    repeats: list[dict[str, int]] = []  # variants whose child was there already: duplicates
    for index, (item, digest) in enumerate(zip(items, digests, strict=True)):
        is_new = fresh.get(digest) == index
        pid = created[digest] if digest in created else known[digest]
        results.append(StoredProgram(pid, is_new))
        if item.variant_id is not None:
            (made if is_new else repeats).append({"v_id": item.variant_id, "v_program": pid})
    _link_variants(conn, made, repeats)
    return results


def _link_variants(conn: Connection, made: list[dict[str, int]], repeats: list[dict[str, int]]) -> None:
    """Point each variant at its program; a variant whose program was already there becomes a duplicate."""
    target = update(VARIANTS).where(VARIANTS.c.id == bindparam("v_id"))
    if made:
        conn.execute(target.values(program_id=bindparam("v_program")), made)
    if repeats:
        conn.execute(target.values(program_id=bindparam("v_program"), status="duplicate"), repeats)
