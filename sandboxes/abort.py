"""Jobs in flight and how to end each at once: what `abort_running()` (Ctrl-C in the loop) needs.

Each evaluation takes a ticket when it starts; `abort_all()` moves to a new epoch and kills every job
registered so far. An evaluation whose ticket is older than the epoch was aborted, whether its process had
started (it was killed), had not started yet (it kills itself on registering), or had already finished (its
outcome may be from before the abort, but the caller asked for it to be dropped, and dropping is safe: the
child is evaluated again on resume).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class RunningJobs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._epoch = 0
        self._kills: dict[int, Callable[[], None]] = {}
        self._next_key = 0

    def ticket(self) -> int:
        """Taken when an evaluation starts; `aborted(ticket)` is True once `abort_all()` ran after that."""
        with self._lock:
            return self._epoch

    def aborted(self, ticket: int) -> bool:
        with self._lock:
            return ticket != self._epoch

    @contextlib.contextmanager
    def running(self, ticket: int, kill: Callable[[], None]) -> Iterator[None]:
        """While inside, `abort_all()` calls `kill` (from its own thread); registering after an abort kills
        at once, so a job that was starting when Ctrl-C came does not run on."""
        with self._lock:
            key, self._next_key = self._next_key, self._next_key + 1
            self._kills[key] = kill
            late = ticket != self._epoch
        try:
            if late:
                _quietly(kill)
            yield
        finally:
            with self._lock:
                self._kills.pop(key, None)

    def abort_all(self) -> None:
        """Kill every registered job; each kill must be quick (a signal, a socket shutdown), never a wait."""
        with self._lock:
            self._epoch += 1
            kills = list(self._kills.values())
        for kill in kills:
            _quietly(kill)


def _quietly(kill: Callable[[], None]) -> None:
    with contextlib.suppress(OSError, ProcessLookupError):
        kill()
