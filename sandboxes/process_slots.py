"""Slots of the process sandbox: the uids a root engine runs candidates as, owned machine-wide, one job at a time;
and the work folders that engines killed mid-evaluation left behind.

Why ownership is machine-wide and checked: everything a candidate may signal, and every process the sweep after a
job looks at (sandboxes/sweep.py), is found by the slot's uid. So a slot uid must be this engine's alone while it
holds it: no other engine's (the locks live at one fixed root-only path, whatever TMPDIR says: two engines with
different TMPDIRs once both took slot 0 and killed each other's candidates), no user's (a uid in the passwd or
group database is skipped), and no process of that uid that this engine did not start may be running (checked
when a slot is claimed and again before each job; a slot found in use is given up for a free one). An engine
without root runs candidates as its own uid: its slots are numbers only, and nothing is claimed.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import queue
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from sandboxes.private_dirs import open_root_folder
from sandboxes.sandbox import SandboxRefused
from sandboxes.sweep import all_threads_dead, process_uids

WORKDIR_PREFIX = "evolve-eval-"
UID_RANGE = 1024
# Root's, under /run (root's own, 0755; a tmpfs emptied at boot): no user can make or replace it, unlike a folder
# under /tmp or /run/lock (both 1777), where a user could make it first and hold every root engine's locks.
LOCK_DIR = Path("/run/vpo-evolve-slots")


@dataclass(frozen=True)
class Slot:
    """One lane of the engine (0..count-1: its memory cgroup's index) and the uid its job runs as (None: ours)."""

    lane: int
    uid: int | None


def uids_in_use() -> set[int]:
    """Every uid (real, effective, saved or filesystem) of a process on this machine that has not ended."""
    used: set[int] = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                uids, zombie = process_uids(entry.name)
                if not (zombie and all_threads_dead(entry.name)):
                    used.update(uids)
    return used


def _account_of(uid: int) -> str | None:
    """The user or group that holds `uid` as its id in the passwd or group database, or None.

    A candidate runs with uid and gid both `uid`: a real account's uid would hand it that user's files and
    processes, a real group's gid that group's files."""
    with contextlib.suppress(KeyError):
        return f"user {pwd.getpwuid(uid).pw_name}"
    with contextlib.suppress(KeyError):
        return f"group {grp.getgrgid(uid).gr_name}"
    return None


def _open_lock_dir() -> int:
    """A descriptor on LOCK_DIR, made if missing, refused unless it and its parent are root's and closed to others."""
    return open_root_folder(LOCK_DIR, "process sandbox")


class SlotPool:
    """The slots of one engine: `count` lanes, each holding one slot number (hence uid `base_uid + slot` where
    `base_uid` is given) through an flock on a file in LOCK_DIR, held until `close` or the engine's exit."""

    def __init__(self, count: int, base_uid: int | None) -> None:
        self._base_uid, self._count = base_uid, count
        self._lock = threading.Lock()  # lanes are retaken by worker threads at once
        self._closed = False
        self._held: dict[int, tuple[int, int]] = {}  # lane -> (slot, its lock's descriptor)
        self._free: queue.Queue[int] = queue.Queue()
        try:
            for lane in range(count):
                if base_uid is not None:
                    self._held[lane] = self._claim(set(), uids_in_use())
                self._free.put(lane)
        except BaseException:
            self.close()
            raise

    @property
    def lanes(self) -> list[int]:
        return list(range(self._count))

    @property
    def uids(self) -> tuple[int, ...]:
        """The uids held now, one per lane (none without root)."""
        base = self._base_uid
        return tuple(base + slot for slot, _ in self._held.values()) if base is not None else ()

    def _claim(self, skip: set[int], in_use: set[int]) -> tuple[int, int]:
        """Lock the first slot no engine holds whose uid is no account's and runs no process; (slot, descriptor)."""
        assert self._base_uid is not None
        held = {slot for slot, _ in self._held.values()} | skip
        folder = _open_lock_dir()
        try:
            for slot in range(UID_RANGE):
                uid = self._base_uid + slot
                if slot in held or uid in in_use or _account_of(uid) is not None:
                    continue
                flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(f"uid-{uid}.lock", flags, 0o600, dir_fd=folder)  # the uid is what is owned
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                if uid in uids_in_use():  # started between the listing and the lock
                    os.close(fd)
                    continue
                return slot, fd
        finally:
            os.close(folder)
        raise SandboxRefused(
            f"process sandbox: no free slot among uids {self._base_uid}..{self._base_uid + UID_RANGE - 1} (each is "
            f"held by another engine in {LOCK_DIR}, a user's or a group's, or running a process); end some engines"
        )

    def take(self) -> Slot:
        """A free lane (waiting for one), its uid first checked to run no process at all: a job's processes are
        swept by the time its lane is given back, so one there now is not this engine's, and the lane gets
        another slot, the one in use is left alone."""
        lane = self._free.get()
        try:
            if self._base_uid is None:
                return Slot(lane, None)
            with self._lock:
                if self._closed:  # never a job without its uid (it would run as root)
                    raise SandboxRefused("process sandbox: it was closed; make a new one")
                slot, fd = self._held[lane]
                in_use = uids_in_use()
                if self._base_uid + slot in in_use:
                    self._held[lane] = self._claim({slot}, in_use)
                    os.close(fd)
                    slot = self._held[lane][0]
                return Slot(lane, self._base_uid + slot)
        except BaseException:
            self._free.put(lane)
            raise

    def give(self, slot: Slot) -> None:
        self._free.put(slot.lane)

    def close(self) -> None:
        """Release every slot (a second call is harmless)."""
        with self._lock:
            for _, fd in self._held.values():
                os.close(fd)
            self._held = {}
            self._closed = True


def remove_stale_workdirs() -> None:
    """Work dirs left by engines that died mid-evaluation (kill -9): their names carry the engine's pid."""
    for entry in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*-*"):
        pid = entry.name[len(WORKDIR_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            pass
