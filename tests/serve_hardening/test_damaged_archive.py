"""`evolve serve`: a damaged archive answers a one-line 503 until it is restored, then serves it again."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import httpx

from tests.helpers import KNOWN
from tests.serve_hardening.served import (
    assert_honest,
)


def _damage(db: Path) -> None:
    """Noise over the first page of the programs and evaluations tables: the file opens, its runs still read."""
    with sqlite3.connect(db) as con:
        size = con.execute("PRAGMA page_size").fetchone()[0]
        roots = dict(con.execute("SELECT name, rootpage FROM sqlite_master WHERE type = 'table'").fetchall())
    with db.open("r+b") as f:
        for table in ("programs", "evaluations"):
            f.seek((roots[table] - 1) * size)
            f.write(b"\xa5" * size)


def test_a_damaged_archive_answers_503_in_one_line_and_recovers_once_restored(archive_db, serve, tmp_path) -> None:
    source, known = archive_db
    db = tmp_path / "runs.db"
    shutil.copy(source, db)
    with sqlite3.connect(db) as con:  # every row in the file itself, none in a WAL beside it
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    good = db.read_bytes()
    _damage(db)  # before serving: a live server's connections hold the pages they read, damaged or not
    served = serve(str(db))
    for path in ("/", "/api/data", f"/api/program/{known[0][0]}"):
        answer = httpx.get(f"{served.url}{path}", timeout=60)
        said = answer.text.strip()
        assert (answer.status_code, "\n" in said) == (503, False), (path, answer.status_code, said)
        assert f"the archive {db} is damaged" in said and "restore it from a copy" in said, said
    db.write_bytes(good)
    assert httpx.get(f"{served.url}/", timeout=60).status_code == 200
    assert httpx.get(f"{served.url}/api/data", timeout=60).json()["meta"]["evaluations"] == len(KNOWN)
    assert_honest(served.url, known)
    assert "Traceback" not in served.output()
