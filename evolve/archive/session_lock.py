"""One live session per problem in an archive: a second `evolve run` or `resume` of it is refused while the first runs.

Why: two sessions on one run each take themselves for its one writer. Seen on a SQLite archive (2026-12-06): the
second found the run `running`, took the first for killed and resumed it beside it; 42 of 48 variants ended up
marked duplicates of programs that nothing else referenced, and `inspect` counted an interruption that never was.
A run's `running` status cannot tell a live session from a killed one at once (its heartbeat is judged stale after
a minute), so the lock here is one that the kernel or the database server drops the moment its holder dies: a
`kill -9` leaves nothing behind, and the resume that follows at once is not refused.

The lock is per problem, not per run, so that it is taken before the session looks for the run to resume (a run
made by one session cannot be picked up by another in between); two problems in one archive still run side by
side. A SQLite file: an flock on `<file>-<problem>.lock` beside it (as SQLite's own `-wal` and `-shm`), which
holds the holder's pid for the refusal's message. PostgreSQL: a session advisory lock on a connection kept for
the session, in autocommit so that no transaction stays open for days. Other servers: no lock.
"""

from __future__ import annotations

import fcntl
import os
import re
import zlib
from pathlib import Path
from typing import Any

from sqlalchemy import text

from evolve.archive.database import ArchiveError, Database, StorageError

SESSION_LOCK_CLASS = 0x6576_5255  # "evRU": the PostgreSQL advisory lock's first key; the problem's crc32 the second


class SessionBusy(ArchiveError):
    """Another live process runs this problem in this archive; `str()` says which and what to do."""


class SessionLock:
    """Held from `acquire` until `release` (or the process's end, however it ends)."""

    def __init__(self, db: Database, problem_name: str) -> None:
        self.db, self.problem_name = db, problem_name
        self._fd: int | None = None
        self._connection: Any = None

    def acquire(self) -> SessionLock:
        if self.db.file is not None:
            self._lock_file(self.db.file)
        elif self.db.engine.dialect.name == "postgresql":
            self._lock_server()
        return self

    def release(self) -> None:
        """Let the next session in; safe to call twice."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
        if self._connection is not None:  # a session advisory lock outlives a connection handed back to the pool
            try:
                self._connection.execute(text("SELECT pg_advisory_unlock(:a, :b)"), self._keys())
            except StorageError:  # the server or the connection is gone, and the lock with it
                self._connection.invalidate()
            self._connection.close()
            self._connection = None

    def _busy(self, holder: str) -> SessionBusy:
        return SessionBusy(
            f"{self.db.url}: {self.problem_name} is being run there now by {holder}; let that run end or stop it "
            "(Ctrl-C), or give this one another --db"
        )

    def _lock_file(self, database: Path) -> None:
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", self.problem_name)[:80]
        database = database.resolve()  # one file reached through a symlink gets the same lock
        path = database.with_name(f"{database.name}-{name}.lock")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise self._busy(f"process {pid}" if pid.isdigit() else "another process") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def _lock_server(self) -> None:
        connection = self.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        got = connection.execute(text("SELECT pg_try_advisory_lock(:a, :b)"), self._keys())
        if not got.scalar():
            connection.close()
            raise self._busy("another session")
        self._connection = connection

    def _keys(self) -> dict[str, int]:
        return {"a": SESSION_LOCK_CLASS, "b": zlib.crc32(self.problem_name.encode()) - 2**31}  # signed 32-bit keys
