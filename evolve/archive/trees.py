"""Programs of several files in the archive: written as content-addressed blobs, read back as their joined text.

A program of several files travels through the engine as one joined text (evolve/filetree.py). Stored whole,
a child that changes one file of fifty would store fifty again; here each distinct file text is one row of
`program_blobs`, keyed by its sha256, and a program is its list of (position, path, digest) in `program_files`.
Its `programs.code` stays empty and `tree_length` holds the joined text's length (what the code_length feature
and the reports measure). Reading joins the files back byte for byte: what the loop stored is what it reads.

Which programs are stored as files is the run's problem's to say (`multi_file`, passed in as a value: the archive
reads no problem config), never the text's: a one-file program whose text starts with a `=== FILE: ` line is kept
whole in `programs.code`, as the one file it is. Reading goes by what each row holds (`tree_length`), so a program
an older engine stored as files is read back as it was.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Table, insert, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from evolve.archive.models import Program, ProgramBlob, ProgramFile
from evolve.filetree import HEADER_PREFIX, tree_files

BLOBS: Table = ProgramBlob.__table__  # type: ignore[assignment]
FILES: Table = ProgramFile.__table__  # type: ignore[assignment]


def blob_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def stored_files(code: str, multi_file: bool) -> list[tuple[str, str]] | None:
    """The (path, text) files a program is stored as, or None when it is stored whole: always on a problem of one
    file, and for a text of a problem of several files that does not split (which no parsed child is)."""
    return tree_files(code) if multi_file else None


def store_trees(conn: Connection, trees: Sequence[tuple[int, list[tuple[str, str]]]]) -> None:
    """Write the files of new programs (program id, files): each blob not yet stored, then the file rows."""
    if not trees:
        return
    blobs = {blob_digest(text): text for _, files in trees for _, text in files}
    known = set(conn.scalars(select(BLOBS.c.digest).where(BLOBS.c.digest.in_(list(blobs)))))
    fresh = [{"digest": d, "text": t} for d, t in blobs.items() if d not in known]
    if fresh:
        conn.execute(_insert_new_blobs(conn), fresh)
    rows = [
        {"program_id": pid, "position": i, "path": path, "digest": blob_digest(text)}
        for pid, files in trees
        for i, (path, text) in enumerate(files)
    ]
    conn.execute(insert(FILES), rows)


def _insert_new_blobs(conn: Connection) -> Any:
    """An INSERT that skips a blob another writer stored since our look-up (blobs are shared by all runs)."""
    if conn.dialect.name == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(BLOBS).on_conflict_do_nothing(index_elements=["digest"])
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(BLOBS).on_conflict_do_nothing(index_elements=["digest"])
    return insert(BLOBS)


def joined_texts(s: Session | Connection, program_ids: Iterable[int]) -> dict[int, str]:
    """program id -> its joined text, for those of `program_ids` stored as files."""
    ids = list(program_ids)
    if not ids:
        return {}
    q = (
        select(FILES.c.program_id, FILES.c.path, BLOBS.c.text)
        .join(BLOBS, BLOBS.c.digest == FILES.c.digest)
        .where(FILES.c.program_id.in_(ids))
        .order_by(FILES.c.program_id, FILES.c.position)
    )
    parts: dict[int, list[str]] = {}
    for pid, path, text in s.execute(q):
        parts.setdefault(pid, []).append(f"{HEADER_PREFIX}{path} ===\n{text}")
    return {pid: "".join(chunks) for pid, chunks in parts.items()}


def resolve_codes(s: Session | Connection, rows: Iterable[Any]) -> dict[int, str]:
    """(id, code, tree_length) rows -> id -> the program's text, its files joined where it has them."""
    rows = list(rows)
    trees = joined_texts(s, [pid for pid, _, length in rows if length is not None])
    return {pid: trees.get(pid, code) if length is not None else code for pid, code, length in rows}


def fill_code(s: Session, programs: Iterable[Program | None]) -> None:
    """Give loaded Program objects of several files their joined text, without marking them changed."""
    wanted = [p for p in programs if p is not None and p.tree_length is not None]
    trees = joined_texts(s, [p.id for p in wanted])
    for p in wanted:
        set_committed_value(p, "code", trees.get(p.id, p.code))
