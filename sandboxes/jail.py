"""A minimal filesystem view for the process sandbox, made by bubblewrap (Debian's `bubblewrap`, Flatpak's sandbox).

The candidate sees `/usr` and the Python runtime read-only, its job's files read-only in a size-capped tmpfs
at `/work`, the problem's `data/` read-only at `/data`, a private `/tmp`, `/dev` and `/proc`, and nothing else:
no problem folder, no archive, no home, no other process. It runs in fresh pid, network, IPC, UTS and cgroup
namespaces; when the pid namespace's first process dies the kernel kills every process left in it, so nothing
outlives a job.

As root no user namespace is made: the harness starts as root holding only CAP_SETUID/CAP_SETGID and drops to
the slot's uid before it reads the job. Without root a user namespace is needed (the kernel must allow them).
We use a kept tool rather than our own mounts: bubblewrap checks every call it makes and exits non-zero on any
failure, so a sandbox that cannot be made is refused, never run weaker.
"""

from __future__ import annotations

import os
import platform
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

WORK, DATA = "/work", "/data"
WORK_BYTES = 256 << 20  # what a candidate may write under /work in all, like the Docker sandbox's tmpfs


# Refused with EPERM (numbers and audit arch per machine):
# - add_key, request_key, keyctl: kernel keyrings outlive processes and are keyed by uid, so one job could leave
#   keys for a later job of its slot;
# - memfd_create, memfd_secret, shmget: memory held through them needs no mapping once written (write() to a
#   memfd, a SysV segment attached, filled and detached), so RLIMIT_AS never sees it. Where no memory cgroup
#   bounds the job, they would let one process hold any amount of the host's memory. Python never needs them.
_DENIED_SYSCALLS = {
    "x86_64": (0xC000003E, (248, 249, 250, 319, 447, 29)),
    "aarch64": (0xC00000B7, (217, 218, 219, 279, 447, 194)),
}
_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | 1


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


def seccomp_program() -> bytes | None:
    """A classic-BPF seccomp filter denying `_DENIED_SYSCALLS` (and x86's x32 ABI), or None on other machines."""
    known = _DENIED_SYSCALLS.get(platform.machine())
    if known is None:
        return None
    arch, calls = known
    ld_abs, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06
    n = len(calls)
    x32 = platform.machine() == "x86_64"
    tail = n + (1 if x32 else 0)  # tests between loading the number and `allow`
    # Another ABI (i386's int 0x80 numbers these differently) is refused outright: Python never uses one.
    prog = [_insn(ld_abs, 4), _insn(jeq, arch, 0, tail + 2), _insn(ld_abs, 0)]
    if x32:
        prog.append(_insn(jge, 0x40000000, tail, 0))
    prog += [_insn(jeq, nr, n - i, 0) for i, nr in enumerate(calls)]
    prog += [_insn(ret, _ALLOW), _insn(ret, _EPERM)]
    return b"".join(prog)


def seccomp_fd() -> int | None:
    """A descriptor holding the filter, for `bwrap --seccomp FD` (bubblewrap reads it once); None when unknown."""
    program = seccomp_program()
    if program is None:
        return None
    fd = os.memfd_create("evolve-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def python_roots() -> list[Path]:
    """Host folders the interpreter needs: its installation and, for a virtual environment, the environment."""
    roots = {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve(), Path(sys.executable).resolve().parent}
    outside_usr = [r for r in roots if not r.is_relative_to("/usr")]
    # Keep only the outermost: a bind inside another bind is redundant.
    return sorted(r for r in outside_usr if not any(r != o and r.is_relative_to(o) for o in outside_usr))


@dataclass(frozen=True)
class Jail:
    """How to start a command under bubblewrap; `argv` gives the full command line for one job."""

    bwrap: str
    as_root: bool

    def argv(self, workdir: str, data_dir: Path | None, command: list[str], seccomp: int | None = None) -> list[str]:
        namespaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not self.as_root:  # our own user namespace, and none deeper for the candidate to make
            namespaces[:0] = ["--unshare-user", "--disable-userns"]
        args = [self.bwrap, *namespaces, "--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr"]
        for name in ("bin", "lib", "lib64", "sbin"):
            host = Path("/") / name
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{name}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{name}"]
        for extra in ("/etc/ld.so.cache", "/etc/localtime"):
            if os.path.exists(extra):
                args += ["--ro-bind", extra, extra]
        # Private, size-capped temp space (the sizes match the Docker sandbox's tmpfs mounts).
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "01777", "--size", str(256 << 20), "--tmpfs", "/tmp"]
        args += ["--perms", "01777", "--size", str(64 << 20), "--tmpfs", "/dev/shm"]
        for root in python_roots():
            for parent in reversed(root.parents[:-1]):  # bubblewrap would make missing parents 0700
                args += ["--perms", "0755", "--dir", str(parent)]
            args += ["--ro-bind", str(root), str(root)]
        # /work is a size-capped tmpfs (as in the Docker sandbox), not the host folder: a candidate cannot fill
        # the host's disk. The files the engine wrote for the job are bound into it read-only.
        args += ["--perms", "01777", "--size", str(WORK_BYTES), "--tmpfs", WORK]
        for name in sorted(os.listdir(workdir)):
            args += ["--ro-bind", os.path.join(workdir, name), f"{WORK}/{name}"]
        if data_dir is not None:
            args += ["--ro-bind", str(data_dir), DATA]
        if self.as_root:
            args += ["--cap-add", "CAP_SETUID,CAP_SETGID"]
        if seccomp is not None:
            args += ["--seccomp", str(seccomp)]
        return [*args, "--chdir", WORK, "--", *command]


def find_jail() -> tuple[Jail | None, str]:
    """A working jail, or None and why not (one line naming the fix)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, "bubblewrap is not installed (apt-get install bubblewrap)"
    jail = Jail(bwrap, os.geteuid() == 0)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            # Inside: a fresh pid namespace, and the host's temp folder (which holds `workdir`) out of sight.
            probe = f"import os; assert os.getpid() < 10 and not os.path.exists({workdir!r})"
            out = subprocess.run(
                jail.argv(workdir, None, [sys.executable, "-I", "-S", "-c", probe]),
                capture_output=True,
                text=True,
                timeout=30,
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bubblewrap did not start ({exc})"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no message"])[-1]
        return None, f"bubblewrap cannot make the sandbox here ({last}); user namespaces may be disabled"
    return jail, ""
