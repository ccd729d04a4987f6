"""Two study lanes that take turns to update lend the waiting lane's core to the update under way.

benchmarks/study_lanes.sh pins each lane to a core of its own and lets one lane update at a time
(`STUDY_UPDATE_LOCK`: two float32 updates at once need more memory than a 24 GB machine has). An update is many
minutes of matrix products (on minimizer, with the newest version's groups and the version's before, 15 and more
on one core), a group's sampling two or three, so the other lane soon waits for the lock with its core idle: on
2026-12-06 lane two waited 20 minutes for one of lane one's updates, one core of two doing the study's work.

So a lane that waits for the lock says so (a marker file beside the lock, named by its process id, for as long as
it waits), and the update under way, between two of its passes, spreads over every core while such a waiter is
alive, and goes back to its own core and one thread as soon as none is (the other lane sampling again) and before
it lets go of the lock. What an update computes is the same; only how its products are split over threads changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

MARKER = ".waiting."  # `<lock>.waiting.<pid>`: that process waits for the lock


@contextmanager
def waiting_for(lock: Path) -> Iterator[None]:
    """Mark this process as waiting for `lock` for the duration of the block (the wait itself)."""
    marker = lock.with_name(f"{lock.name}{MARKER}{os.getpid()}")
    marker.write_text("")
    try:
        yield
    finally:
        marker.unlink(missing_ok=True)


def others_waiting(lock: Path) -> bool:
    """Whether a live process other than this one waits for `lock` (a marker left by a killed lane counts not)."""
    for marker in lock.parent.glob(f"{lock.name}{MARKER}*"):
        pid = marker.name.rsplit(".", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and _alive(int(pid)):
            return True
    return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


class BorrowedCores:
    """The calling thread's cores and torch threads, widened to every core while another lane waits for `lock`.
    Call `adjust` from the thread that runs the update (affinity and OpenMP's thread count belong to a thread),
    and `restore` before the lock is let go."""

    def __init__(self, lock: Path) -> None:
        import torch

        self.lock = lock
        self.own_cores = os.sched_getaffinity(0)
        self.own_threads = torch.get_num_threads()
        self.every_core = set(range(os.cpu_count() or 1))
        self.widened = False

    def adjust(self) -> None:
        self._set(others_waiting(self.lock))

    def restore(self) -> None:
        self._set(False)

    def _set(self, widen: bool) -> None:
        import torch

        if widen == self.widened or self.every_core == self.own_cores:
            return
        os.sched_setaffinity(0, self.every_core if widen else self.own_cores)
        torch.set_num_threads(len(self.every_core) if widen else self.own_threads)
        self.widened = widen
