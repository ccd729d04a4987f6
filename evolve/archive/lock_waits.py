"""Says so, in one line, when a statement on a SQLite archive waits for another process's lock.

Why: SQLite waits for a lock without a word (its busy timeout, 30 s, then the run's own retries). A local user who
could merely read an archive took a shared lock on the write-lock byte of its -shm, and root's run stopped writing
for 120 s, silently (issue #57, second round, finding 21). New archives are now private to their user (see
evolve/archive/database.py), but an older one, or one shared on purpose, may still be opened by others, and two of
the user's own runs on one archive wait for each other too. So a statement still running after `NOTICE_S` whose
file another process holds a lock on that makes it wait is named, with that process, as the kernel reports it.
A statement that is merely slow (a busy machine) holds no one else's lock and is not reported.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

from evolve.archive.file_locks import Holder, holders

log = logging.getLogger(__name__)
NOTICE_S = 3.0  # how long a statement runs before a lock it waits for is named
POLL_S = 0.5
# SQLite's WAL locks are bytes of the -shm: 120 the writer's, 121 the checkpointer's, 122 recovery's. Another
# process's lock on one of them (even a shared one, which a read-only descriptor can take) holds writers back.
WAL_LOCK_BYTES = (120, 122)


class LockWaits:
    """Watches one SQLite archive's statements from `attach` until `close`, in a thread started by the first."""

    def __init__(self, engine: Engine, file: Path) -> None:
        self._file = file
        # thread -> [when its statement began, whether it was named, the thread]: a thread ended by an error that
        # another error hook raised past `_end` leaves its entry, which is skipped once that thread is gone
        self._running: dict[int, list[Any]] = {}
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        event.listen(engine, "before_cursor_execute", self._begin)
        event.listen(engine, "after_cursor_execute", self._end)
        event.listen(engine, "handle_error", self._end)

    def _begin(self, *_: Any) -> None:
        with self._guard:
            self._running[threading.get_ident()] = [time.monotonic(), False, threading.current_thread()]
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._watch, name="archive-lock-waits", daemon=True)
                self._thread.start()

    def _end(self, *_: Any) -> None:
        with self._guard:
            self._running.pop(threading.get_ident(), None)

    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            now = time.monotonic()
            with self._guard:
                late = [e for e in self._running.values() if not e[1] and now - e[0] >= NOTICE_S and e[2].is_alive()]
            if not late:
                continue
            found = self.blockers()
            if not found:
                continue
            with self._guard:
                for entry in late:
                    entry[1] = True
            waited = now - min(entry[0] for entry in late)
            where, holder = found[0]
            others = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
            mine = holder.uid == os.geteuid()
            fix = "let that run end" if mine else f"end that process, and keep other users out: chmod 600 {self._file}*"
            log.warning(
                "archive %s: waiting %.0f s for a lock on %s, held by %s%s; this goes on once it is let go (%s)",
                self._file,
                waited,
                where,
                holder.who(),
                others,
                fix,
            )

    def blockers(self) -> list[tuple[Path, Holder]]:
        """The locks of other processes that make this archive's statements wait: any on the -shm's WAL lock bytes,
        and exclusive ones on the file itself (a process using it without WAL)."""
        found: list[tuple[Path, Holder]] = []
        shm = self._file.with_name(self._file.name + "-shm")
        for path, wanted in ((shm, lambda h: h.covers(*WAL_LOCK_BYTES)), (self._file, lambda h: h.mode == "WRITE")):
            try:
                locks = holders(os.stat(path), "POSIX") or []
            except OSError:
                continue
            found += [(path, h) for h in locks if h.pid != os.getpid() and wanted(h)]
        return found

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * POLL_S)
