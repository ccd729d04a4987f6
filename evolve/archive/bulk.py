"""Rows written as they are given, ids and times included, in one transaction: how a benchmark builds an archive
of 100k programs in seconds, where the engine's own writers would spend minutes hashing and batching.

Not a way for the engine to store anything (`Archive.add_evaluated_programs` and `add_group` are): nothing here
checks a row against the others. It exists so that code outside the archive fills tables by name without
importing the ORM classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import insert

from evolve.archive.facade import Archive
from evolve.archive.models import Base


def load_rows(archive: Archive, tables: Sequence[tuple[str, list[dict[str, Any]]]]) -> None:
    """Insert each (table name, rows) in order, all in one transaction; a table not in the schema is a KeyError."""
    with archive.db.engine.begin() as conn:
        for name, rows in tables:
            if rows:
                conn.execute(insert(Base.metadata.tables[name]), rows)
