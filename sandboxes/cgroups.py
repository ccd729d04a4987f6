"""Per-slot memory cgroups for the process sandbox: one bound on all the memory a job holds.

RLIMIT_AS bounds one process's address space. It does not see memory held without a mapping (a memfd or SysV
segment filled with write(), files in the job's tmpfs mounts, pipe buffers), and each of a job's processes gets
its own. A memory cgroup charges every page that any process of the job allocates, tmpfs and shmem included, to
one counter with one limit; past it the kernel's OOM killer ends a process of the job, and the job is `memory`.

Made where the engine may. As root: at the top of the mounted hierarchy (v1's `memory`, or v2 where its top
hands memory to its children), beside other services' groups and never inside one, whose removal a leftover
group would block. Without root: in the engine's own v2 cgroup, when it has the memory controller and is ours
(a systemd unit or scope with Delegate=yes). Names carry the engine's pid and the slot, so the groups of an
engine killed with SIGKILL are emptied and removed by the next one, like stale work dirs.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "vpo-evolve-"
# Sandboxes made by one process (a test, a benchmark, an engine reopened) each get their own groups: lanes are
# numbered from 0 in every pool, so the pid and the lane alone would let one sandbox's close remove another's.
_instances = itertools.count()


def _read(path: Path) -> str:
    with open(path) as f:
        return f.read()


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _counter(path: Path, name: str) -> int:
    """A named line of a flat keyed file (memory.events, memory.oom_control); -1 when the kernel has none."""
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return int(value)
    return -1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


@dataclass
class SlotCgroup:
    """One slot's memory cgroup; every process of the slot's job runs in it, placed there before it execs."""

    path: Path
    v2: bool
    _ooms: int = field(default=0, repr=False)

    def join(self) -> None:
        """Move the calling process into the group (a child between fork and exec: raw calls only)."""
        fd = os.open(self.path / "cgroup.procs", os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    def prepare(self, limit_bytes: int) -> None:
        """Empty the group, set this job's limit, note the OOM count so that `oom_killed` sees this job only."""
        self.kill()
        try:
            self._limit(limit_bytes)
        except OSError:  # charges the kernel cannot reclaim (a file a weak-mode job left in the host's /dev/shm)
            self.remove()
            self.path.mkdir()
            self._limit(limit_bytes)
        self._ooms = self._oom_count()

    def _limit(self, limit_bytes: int) -> None:
        if self.v2:
            _write(self.path / "memory.max", str(limit_bytes))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (self.path / name).exists():  # no swap; an OOM ends the whole job at once
                    _write(self.path / name, value)
            return
        memsw = self.path / "memory.memsw.limit_in_bytes"  # present where swap is accounted
        if memsw.exists():  # memory+swap may never be set below memory: lift it, set memory, lower it
            _write(memsw, "-1")
        _write(self.path / "memory.limit_in_bytes", str(limit_bytes))
        if memsw.exists():
            _write(memsw, str(limit_bytes))

    def _oom_count(self) -> int:
        if self.v2:
            return _counter(self.path / "memory.events", "oom_kill")
        count = _counter(self.path / "memory.oom_control", "oom_kill")  # kernels since 4.13
        return count if count >= 0 else int(_read(self.path / "memory.failcnt"))

    def oom_killed(self) -> bool:
        """Whether the kernel's OOM killer ended a process of the group since `prepare`."""
        return self._oom_count() > self._ooms

    def kill(self, rounds: int = 200) -> int:
        """SIGKILL every process in the group until none is listed (the kernel lists no zombie)."""
        killed = 0
        if self.v2 and (self.path / "cgroup.kill").exists():  # kernels since 5.14: the whole group in one step
            _write(self.path / "cgroup.kill", "1")
        for _ in range(rounds):
            pids = [int(p) for p in _read(self.path / "cgroup.procs").split()]
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
            time.sleep(0.005)
        return killed

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.kill()
        for _ in range(100):  # the last killed processes may still be leaving
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                time.sleep(0.01)


def _unescape(text: str) -> str:
    """/proc/self/mountinfo writes space, tab, newline and backslash as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        text = text.replace(code, char)
    return text


def _cgroup_mounts() -> list[tuple[Path, str, str, set[str]]]:
    """(mount point, root inside its hierarchy, "cgroup" or "cgroup2", options) of every cgroup mount."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if len(fields) >= 5 and tail and tail[0] in ("cgroup", "cgroup2"):
                options = set(tail[2].split(",")) if len(tail) > 2 else set()
                found.append((Path(_unescape(fields[4])), _unescape(fields[3]), tail[0], options))
    return found


def _own_v2_path() -> str | None:
    """The engine's cgroup in the v2 hierarchy (the "0::" line of /proc/self/cgroup), or None."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            if line.startswith("0::"):
                return line[3:].rstrip("\n")
    return None


def _has_memory(folder: Path, name: str) -> bool:
    return (folder / name).exists() and "memory" in _read(folder / name).split()


def _v2_parent(mount: Path, root: str, path: str) -> tuple[Path | None, str]:
    """The engine's own v2 cgroup, with the memory controller enabled for its children; or None and why not."""
    root = root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None, f"cgroup v2: the engine's cgroup {path} is outside the mount {mount}"
    own = mount / path[len(root) :].lstrip("/")
    if own.name == f"{PREFIX}{os.getpid()}-engine":  # the leaf we moved into, below
        own = own.parent
    if not _has_memory(own, "cgroup.controllers"):
        return None, f"cgroup v2: the memory controller is not delegated to {own}"
    if not os.access(own, os.W_OK):
        return None, f"cgroup v2: {own} is not ours (run the engine under systemd-run --scope -p Delegate=yes)"
    if _has_memory(own, "cgroup.subtree_control"):
        return own, ""
    try:
        _write(own / "cgroup.subtree_control", "+memory")
        return own, ""
    except OSError as exc:
        if exc.errno != errno.EBUSY or _read(own / "cgroup.procs").split() != [str(os.getpid())]:
            return None, f"cgroup v2: cannot enable memory for the children of {own} ({exc.strerror})"
    # A cgroup holding processes cannot hand controllers to its children. Alone in ours (a delegated unit),
    # the engine moves into a leaf of its own first, as systemd's delegation rules ask.
    try:
        leaf = own / f"{PREFIX}{os.getpid()}-engine"
        leaf.mkdir(exist_ok=True)
        _write(leaf / "cgroup.procs", str(os.getpid()))
        _write(own / "cgroup.subtree_control", "+memory")
    except OSError as exc:
        return None, f"cgroup v2: cannot enable memory for the children of {own} ({exc.strerror})"
    return own, ""


def find_parent() -> tuple[Path | None, bool, str]:
    """Where this engine can make memory cgroups: (folder, is v2, "") or (None, False, why not)."""
    reasons = []
    try:
        for mount, root, kind, options in _cgroup_mounts():
            if kind == "cgroup" and "memory" in options:
                if os.access(mount, os.W_OK):
                    return mount, False, ""
                reasons.append(f"cgroup v1: {mount} is writable by root only")
            elif kind == "cgroup2" and _has_memory(mount, "cgroup.subtree_control") and os.access(mount, os.W_OK):
                return mount, True, ""  # root, like v1: the slots sit at the top of what is mounted
            elif kind == "cgroup2" and (own := _own_v2_path()) is not None:
                parent, why = _v2_parent(mount, root, own)
                if parent is not None:
                    return parent, True, ""
                reasons.append(why)
    except OSError as exc:
        reasons.append(f"cannot read the cgroup files ({exc})")
    return None, False, (reasons or ["no memory cgroup hierarchy is mounted"])[0]


def make_slot_cgroups(slots: list[int]) -> tuple[dict[int, SlotCgroup], str]:
    """One memory cgroup per slot, after removing those of dead engines; ({}, why) where none can be made."""
    parent, v2, why = find_parent()
    if parent is None:
        return {}, why
    made: dict[int, SlotCgroup] = {}
    instance = next(_instances)
    try:
        for entry in parent.glob(f"{PREFIX}*-*"):
            pid = entry.name[len(PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                SlotCgroup(entry, v2).remove()
        for slot in slots:
            path = parent / f"{PREFIX}{os.getpid()}-{instance}-{slot}"
            path.mkdir(exist_ok=True)
            made[slot] = SlotCgroup(path, v2)
    except OSError as exc:
        for cgroup in made.values():
            with contextlib.suppress(OSError):
                cgroup.remove()
        return {}, f"cannot make a memory cgroup in {parent} ({exc.strerror or exc})"
    return made, ""


def remove_all(cgroups: list[SlotCgroup]) -> None:
    """Empty and remove the groups; a group the kernel will not let go of stays for the next start to remove."""
    for cgroup in cgroups:
        with contextlib.suppress(OSError):
            cgroup.remove()
