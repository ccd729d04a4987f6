"""What contains a process sandbox's candidates, said in one line (`ProcessSandbox.isolation()`).

Apart from sandboxes/process.py because it is prose about the containment, not the containment: it reads the facts
the sandbox found when it started (a jail or why none, a uid per slot, a network namespace, memory cgroups or why
none, which sockets a candidate gets) from one record and says which bounds hold, so that a run's log and the
`WEAK` warning name exactly what a candidate can and cannot reach.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandboxes.jail import SCRATCH_BYTES, WORK_BYTES
from sandboxes.seccomp import SocketRule


@dataclass(frozen=True)
class Containment:
    """The facts a process sandbox found at its start, as `describe` reads them."""

    jailed: bool  # bubblewrap runs each job
    why_no_jail: str  # why it does not, when it does not
    drop_uid: bool  # candidates run as their slot's own uid
    base_uid: int  # the first slot's uid
    network_isolated: bool  # an empty network namespace (the jail's own, or one unshared)
    nice: int  # the candidates' CPU weight; 0 leaves it alone
    sockets: SocketRule  # the sockets a candidate gets, by what bounds their buffers
    memory_cgroups: bool  # each slot has a memory cgroup
    why_no_cgroup: str  # why not, when not


def describe(facts: Containment) -> str:
    """One line: who a candidate runs as, what it sees, and what bounds its memory."""
    if facts.jailed:
        who = f"per-slot uid {facts.base_uid}+" if facts.drop_uid else "your uid in a user namespace"
        return (
            f"process sandbox (bubblewrap): {who}; sees only read-only /usr and Python, its own /work, "
            "data/ read-only, private /tmp and /proc; own pid/network/IPC namespaces, no user namespaces; "
            f"rlimits on CPU/files/processes{_weight(facts)}, scrubbed env; {_memory_bound(facts)}"
        )
    parts = [f"process sandbox: WEAK: candidates can read the host's files ({facts.why_no_jail});"]
    parts.append(f"per-slot uid {facts.base_uid}+," if facts.drop_uid else "runs as your user (no uid separation),")
    parts.append("no network namespace," if not facts.network_isolated else "empty network namespace,")
    parts.append("engine's /proc entries and arguments hidden, no user namespaces,")
    parts.append(f"rlimits on CPU/files/processes{_weight(facts)}, scrubbed env, private temp dir;")
    parts.append(_memory_bound(facts))
    return " ".join(parts)


def _weight(facts: Containment) -> str:
    return f", nice {facts.nice}" if facts.nice else ""


def _memory_bound(facts: Containment) -> str:
    sockets = {
        SocketRule.ALL: "",
        SocketRule.UNIX_ONLY: "; only AF_UNIX sockets (cgroup v1 does not count TCP buffers)",
        SocketRule.NONE: "; sockets refused",
    }[facts.sockets]
    if facts.memory_cgroups:
        version = "v2" if facts.sockets is SocketRule.ALL else "v1"
        return f"memory: one cgroup ({version}) per job bounds all its processes and temp files together{sockets}"
    scratch = sum(SCRATCH_BYTES.values()) >> 20 if facts.jailed else None
    folders = f" (+ {WORK_BYTES >> 20} MiB per folder of a program)"
    files = f" + {scratch} MiB of scratch tmpfs{folders}" if scratch else " + files in its temp dir (host disk)"
    return (
        f"memory: no memory cgroup ({facts.why_no_cgroup}): RLIMIT_AS per process x RLIMIT_NPROC{files}; "
        "memfd, SysV shm/msg, vmsplice and io_uring refused" + sockets + "; pipes bounded per user by the kernel"
    )
