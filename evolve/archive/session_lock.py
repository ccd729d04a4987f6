"""One live session per problem in an archive: a second `evolve run` or `resume` of it is refused while the first runs.

Why: two sessions on one run each take themselves for its one writer. Seen on a SQLite archive (2026-12-06): the
second found the run `running`, took the first for killed and resumed it beside it; 42 of 48 variants ended up
marked duplicates of programs that nothing else referenced, and `inspect` counted an interruption that never was.
A run's `running` status cannot tell a live session from a killed one at once (its heartbeat is judged stale after
a minute), so the lock here is one that the kernel or the database server drops the moment its holder dies: a
`kill -9` leaves nothing behind, and the resume that follows at once is not refused.

The lock is per problem, not per run, so that it is taken before the session looks for the run to resume (a run
made by one session cannot be picked up by another in between); two problems in one archive still run side by
side. A SQLite file: an flock on `<file>-<problem>-<hash>.lock` beside it (as SQLite's own `-wal` and `-shm`),
which holds the holder's pid for people to read. Its name is predictable, so beside an archive in a shared folder
another user may make it first: it is never opened through a link nor written unless it is ours, and a refusal
names the holder the kernel reports (evolve/archive/file_locks.py), never the pid written in the file. PostgreSQL:
a session advisory lock on a connection kept for the session, in autocommit so that no transaction stays open for
days. Other servers: no lock.

A lock can be lost under a live holder: its file deleted by hand, its server connection ended (an idle timeout,
`pg_terminate_backend`). The run calls `keep` with every state save (seconds apart): it takes the lock again, and
where another session got it first, this one stops. Not covered: a second name for the same SQLite file (a hard
link), which SQLite itself does not support (each name gets its own write-ahead log).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import stat
from pathlib import Path
from typing import Any

from sqlalchemy import text

from evolve.archive.database import ArchiveError, Database, StorageError
from evolve.archive.file_locks import holders


class SessionBusy(ArchiveError):
    """Another live process runs this problem in this archive; `str()` says which and what to do."""


class SessionLock:
    """Held from `acquire` until `release` (or the process's end, however it ends)."""

    def __init__(self, db: Database, problem_name: str) -> None:
        self.db, self.problem_name = db, problem_name
        digest = hashlib.sha256(problem_name.encode()).digest()
        self._key = int.from_bytes(digest[:8], "big", signed=True)  # PostgreSQL's advisory lock key (bigint)
        self._path: Path | None = None
        if db.file is not None:
            readable = re.sub(r"[^A-Za-z0-9_.-]", "_", problem_name)[:40]
            database = db.file.resolve()  # one file reached through a symlink gets the same lock
            self._path = database.with_name(f"{database.name}-{readable}-{digest.hex()[:12]}.lock")
        self._server = db.file is None and db.engine.dialect.name == "postgresql"
        self._held = False  # acquired and not released: `keep` retakes a lost lock until it has it again
        self._fd: int | None = None
        self._connection: Any = None

    def acquire(self) -> SessionLock:
        if self._path is not None:
            self._lock_file(self._path)
        elif self._server:
            self._lock_server()
        self._held = True
        return self

    def keep(self) -> str | None:
        """Take the lock again where it was lost under this live session; None while it holds, else the line
        that says another session has it now (the caller stops)."""
        if not self._held:
            return None
        try:
            if self._path is not None and (self._fd is None or not _same_file(self._fd, self._path)):
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None
                self._lock_file(self._path)
            elif self._server and (self._connection is None or not self._server_lock_alive()):
                if self._connection is not None:
                    self._drop_connection()
                self._lock_server()
        except SessionBusy as exc:
            return f"lost the session lock, and another process took it: {exc}"
        except (ArchiveError, OSError, StorageError):  # the folder or the server unreachable now: tried next save
            return None
        return None

    def release(self) -> None:
        """Let the next session in; safe to call twice."""
        self._held = False
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None
        if self._connection is not None:  # a session advisory lock outlives a connection handed back to the pool
            with contextlib.suppress(StorageError):  # gone: the lock went with it
                self._connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self._key})
            self._drop_connection()

    def _busy(self, holder: str) -> SessionBusy:
        return SessionBusy(
            f"{self.db.url}: {self.problem_name} is being run there now by {holder}; let that run end or stop it "
            "(Ctrl-C), or give this one another --db"
        )

    def _lock_file(self, path: Path) -> None:
        fd = _open_lock_file(path)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
            os.close(fd)
            raise ArchiveError(
                f"{path}: the run's lock file is not a plain file of its own (a device, or one with another name: "
                "a hard link); remove it and start again"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            found = holders(info, "FLOCK")
            os.close(fd)
            raise self._busy(found[0].who() if found else "another process") from None
        if info.st_uid == os.geteuid():  # never written where it is another user's: it only serves messages
            with contextlib.suppress(OSError):  # a read-only lock file goes without
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def _lock_server(self) -> None:
        connection = self.db.engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            got = connection.execute(text("SELECT pg_try_advisory_lock(:key)"), {"key": self._key}).scalar()
        except StorageError:
            connection.invalidate()
            connection.close()
            raise
        if not got:
            connection.close()
            raise self._busy("another session")
        self._connection = connection

    def _server_lock_alive(self) -> bool:
        """Whether this session's connection still holds the lock (the query also keeps it from sitting idle)."""
        try:
            held = self._connection.execute(
                text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted")
            ).scalar()
        except StorageError:
            return False
        return bool(held)

    def _drop_connection(self) -> None:
        with contextlib.suppress(StorageError):
            self._connection.invalidate()  # never back to the pool: its session may still hold the lock
            self._connection.close()
        self._connection = None


def _open_lock_file(path: Path) -> int:
    """A descriptor on the lock file, made if missing; never through a symbolic link, which another user could
    have put at its name to have this process truncate a file of its choosing (finding 20)."""
    flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # O_NONBLOCK: a FIFO put there must not hang the open
    with contextlib.suppress(OSError):
        return os.open(path, flags | os.O_RDWR | os.O_CREAT, 0o644)
    try:  # made by another user, or a read-only folder: an flock needs no write access
        return os.open(path, flags | os.O_RDONLY)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # (the first open says EACCES for another user's link in a sticky folder)
            raise ArchiveError(f"{path}: a symbolic link where the run's lock file belongs; remove it") from None
        raise ArchiveError(
            f"{path}: cannot open the run's lock file ({exc.strerror}); a run needs the archive's folder writable, "
            "and this file readable"
        ) from None


def _same_file(fd: int, path: Path) -> bool:
    """Whether `path` is still the file locked through `fd` (not deleted, not replaced)."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)
