"""Who holds a lock on a file, as the kernel says (Linux's /proc/locks), for messages that name the real holder.

Why not what a lock file says: its content is whatever its owner wrote. A user who made a run's lock file beside an
archive in a shared folder, held its flock and wrote "1" in it had root's run refused "by process 1" (issue #57,
second round, finding 20). /proc/locks lists each lock with the pid that took it and the file's device and inode,
which no user can forge. Where it cannot be read (not Linux), callers say less rather than trust a file.
"""

from __future__ import annotations

import contextlib
import os
import pwd
from dataclasses import dataclass

PROC_LOCKS = "/proc/locks"


@dataclass(frozen=True)
class Holder:
    """One lock on a file: the process that took it, its user, the kind (FLOCK or POSIX), whether it is shared
    (READ) or exclusive (WRITE), and the bytes it covers."""

    pid: int
    uid: int | None  # None: the process ended since, or is not visible here
    kind: str
    mode: str
    start: int
    end: int | None  # None: to the end of the file

    def who(self) -> str:
        """`process PID`, with its user's name where that is not this process's user."""
        if self.uid is None or self.uid == os.geteuid():
            return f"process {self.pid}"
        with contextlib.suppress(KeyError):
            return f"process {self.pid} of user {pwd.getpwuid(self.uid).pw_name}"
        return f"process {self.pid} of uid {self.uid}"

    def covers(self, first: int, last: int) -> bool:
        """Whether the lock covers any byte from `first` to `last` (both included)."""
        return self.start <= last and (self.end is None or self.end >= first)


def holders(info: os.stat_result, kind: str | None = None) -> list[Holder] | None:
    """The locks granted on the file `info` describes (of `kind` only, where given); None where the kernel's table
    cannot be read."""
    try:
        with open(PROC_LOCKS, encoding="ascii", errors="replace") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    file_id = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    found: list[Holder] = []
    for line in lines:
        fields = line.split()
        if len(fields) < 8 or fields[1] == "->":  # "->": a process waiting for the lock, not holding it
            continue
        lock_kind, mode, pid, where, start, end = fields[1], fields[3], fields[4], fields[5], fields[6], fields[7]
        if where != file_id or (kind is not None and lock_kind != kind) or not pid.lstrip("-").isdigit():
            continue
        last = None if end == "EOF" else int(end)
        found.append(Holder(int(pid), _uid_of(int(pid)), lock_kind, mode, int(start), last))
    return found


def _uid_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
