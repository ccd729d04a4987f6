"""Slots of the process sandbox: numbers (hence uids) owned by one engine through flocks, and the work folders
that engines killed mid-evaluation left behind."""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path

from sandboxes.base import SandboxRefused

WORKDIR_PREFIX = "evolve-eval-"
UID_RANGE = 1024
LOCK_DIR = Path(tempfile.gettempdir()) / "vpo-evolve-slots"


def claim_slots(count: int) -> dict[int, int]:
    """Own `count` slot numbers for this process with an flock each (held until close or exit), so that two
    engines on one machine never share a slot uid and never kill each other's candidates."""
    # One folder per user: only root's engines hand out slot uids, and no user can block another's slots.
    lock_dir = LOCK_DIR if os.geteuid() == 0 else LOCK_DIR.with_name(f"{LOCK_DIR.name}-{os.geteuid()}")
    lock_dir.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(lock_dir)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise SandboxRefused(f"process sandbox: {lock_dir} is not a private folder of ours; remove it")
    claimed: dict[int, int] = {}
    for slot in range(UID_RANGE):
        if len(claimed) == count:
            break
        fd = os.open(lock_dir / f"slot-{slot}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        claimed[slot] = fd
    if len(claimed) < count:
        for fd in claimed.values():
            os.close(fd)
        raise RuntimeError(f"process sandbox: fewer than {count} free slots in {LOCK_DIR}; too many engines running")
    return claimed


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
