"""Finding and killing every process a job left behind, by the slot's uid or by the job's token.

A candidate may fork, call setsid, or end its leader thread alone: the process group is not enough, so the
sweep walks /proc and kills until nothing of the slot is left. Zombies the engine adopted as subreaper are
reaped on the way, so they never count against the slot's process limit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def _stat(pid: int | str) -> tuple[str, int]:
    """(state, ppid) of a process, from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return fields[0].decode(), int(fields[1])


def all_threads_dead(pid: int | str) -> bool:
    """A "Z" in /proc/PID/stat only says the leader thread has exited: the other threads of the process may
    still run (a candidate can end its main thread with a raw SYS_exit). Dead means every thread is dead."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    return False
        except OSError:
            continue
    return True


def procs_matching(uid: int | None, token: bytes | None, adopted_except: frozenset[int] | None = None) -> list[int]:
    """Live processes of the slot; zombies we adopted (as subreaper) are reaped on the way.

    `adopted_except`, where the engine is the subreaper and candidates keep its uid (the WEAK sandbox without
    root), adds every child of the engine but those pids (the leaders of jobs still running): a leftover that
    left its session and dropped the token from its environment is still re-parented to us once its parent
    dies, and the engine makes no other long-lived children."""
    found = []
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            state, ppid = _stat(pid)
            adopted = adopted_except is not None and ppid == me and pid not in adopted_except
            if state in ("Z", "X") and all_threads_dead(pid):
                ours = uid is not None and os.stat(entry.path).st_uid == uid
                if ppid == me and (ours or adopted):
                    os.waitpid(pid, os.WNOHANG)
                continue
            if adopted:
                found.append(pid)
            elif uid is not None:
                if os.stat(entry.path).st_uid == uid:
                    found.append(pid)
            elif token is not None:
                with open(f"{entry.path}/environ", "rb") as f:
                    if token in f.read():
                        found.append(pid)
        except OSError:
            continue
    return [p for p in found if p != me]


def kill_all(
    pgid: int,
    uid: int | None,
    token: bytes | None,
    rounds: int = 50,
    adopted_except: frozenset[int] | None = None,
) -> int:
    """SIGKILL the group and every process of the slot until none is left; returns how many were killed."""
    killed = 0
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    for _ in range(rounds):
        pids = procs_matching(uid, token, adopted_except)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(0.005)
    return killed
