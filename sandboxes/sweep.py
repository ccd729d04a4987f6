"""Finding and killing every process a job left behind, by the slot's uid or by the job's token.

A candidate may fork, call setsid, or end its leader thread alone: the process group is not enough, so the
sweep walks /proc and kills until nothing of the slot is left. Zombies the engine adopted as subreaper are
reaped on the way, so they never count against the slot's process limit.

By uid, only the engine's own descendants are taken: a process of the slot's uid that this engine did not start
(a user's `sleep` run as that uid, another engine's candidate) is never killed. Nothing a job starts can leave
the engine's tree: an orphan is re-parented to the nearest subreaper above it (the engine outside the jail, the
jail's init inside, itself the engine's grandchild), and clone(CLONE_PARENT) makes a sibling, not a stranger.
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


def process_uids(pid: int | str) -> tuple[set[int], bool]:
    """(its real, effective, saved and filesystem uids, whether its leader is a zombie), from /proc/PID/status.

    Not the owner of /proc/PID: that is root for a process that made itself non-dumpable, whatever its uid."""
    with open(f"/proc/{pid}/status", "rb") as f:
        text = f.read()
    state = text.partition(b"\nState:")[2].split(None, 1)[:1]
    uids = text.partition(b"\nUid:")[2].split(b"\n", 1)[0].split()
    return {int(u) for u in uids if u.isdigit()}, state in ([b"Z"], [b"X"])


def descends_from(pid: int, ancestor: int, parents: dict[int, int]) -> bool:
    """Whether `pid` is a descendant of `ancestor`, walking parents (from `parents`, a listing, else /proc).

    A parent gone since the listing had its children re-parented before its /proc entry vanished (to an
    ancestor of its own, the nearest subreaper): the child is asked again for its parent of now."""
    child = None
    for _ in range(1 << 16):  # deeper than any pid table: a cycle of reused pids cannot loop for ever
        if pid == ancestor:
            return True
        if pid <= 1:
            return False
        parent = parents.get(pid)
        if parent is None:
            try:
                parent = parents[pid] = _stat(pid)[1]
            except OSError:
                if child is None:
                    return False
                try:
                    now = _stat(child)[1]
                except OSError:  # the child ended too: nothing left to find
                    return False
                if now == pid:
                    return False
                parents[child], pid = now, now
                continue
        child, pid = pid, parent
    return False


def procs_matching(uid: int | None, token: bytes | None, adopted_except: frozenset[int] | None = None) -> list[int]:
    """Live processes of the slot; zombies we adopted (as subreaper) are reaped on the way.

    `adopted_except`, where the engine is the subreaper and candidates keep its uid (the WEAK sandbox without
    root), adds every child of the engine but those pids (the leaders of jobs still running): a leftover that
    left its session and dropped the token from its environment is still re-parented to us once its parent
    dies. The engine's other long-lived children (the evaluator's score() processes, evolve/problem/trusted.py)
    are among the pids spared, as the running jobs' leaders are."""
    found = []
    me = os.getpid()
    parents: dict[int, int] = {}
    of_uid = []  # processes whose uid decides: taken once known to descend from the engine
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            state, ppid = _stat(pid)
            parents[pid] = ppid
            adopted = adopted_except is not None and ppid == me and pid not in adopted_except
            if state in ("Z", "X") and all_threads_dead(pid):
                ours = uid is not None and ppid == me and uid in process_uids(pid)[0]
                if ppid == me and (ours or adopted):
                    os.waitpid(pid, os.WNOHANG)
                continue
            if adopted:
                found.append(pid)
            elif uid is not None:
                of_uid.append(pid)
            elif token is not None:
                with open(f"{entry.path}/environ", "rb") as f:
                    if token in f.read():
                        found.append(pid)
        except OSError:
            continue
    for pid in of_uid:
        with contextlib.suppress(OSError):
            if descends_from(pid, me, parents) and uid in process_uids(pid)[0]:
                found.append(pid)
    return [p for p in found if p != me]


def kill_all(
    pgid: int,
    uid: int | None,
    token: bytes | None,
    rounds: int = 50,
    adopted_except: frozenset[int] | None = None,
) -> int:
    """SIGKILL the group and every process of the slot (by `uid`, among the engine's descendants; else by `token`)
    until none is left; returns how many were killed.

    The first listing comes before the group's kill: while the group's processes live, what they started is still
    below them, whether or not the engine is the subreaper that orphans come back to."""
    killed = 0
    pids = procs_matching(uid, token, adopted_except)
    with contextlib.suppress(OSError):
        os.killpg(pgid, signal.SIGKILL)
    for _ in range(rounds):
        pids = pids or procs_matching(uid, token, adopted_except)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        pids = []
        time.sleep(0.005)
    return killed
