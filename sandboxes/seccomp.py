"""The process sandbox's seccomp filter: the few system calls a candidate is refused, in and out of the jail.

Refused with EPERM (numbers per machine below):
- add_key, request_key, keyctl: kernel keyrings outlive processes and are keyed by uid, so one job could leave
  keys for a later job of its slot;
- memfd_create, memfd_secret, shmget, msgget, semget, vmsplice: memory held through them needs no mapping once
  written (a memfd or SysV segment filled with write(), message queues, semaphore sets, user pages pinned in a
  pipe and then unmapped), so RLIMIT_AS never sees it; a red-team candidate held 3 GB of semaphore sets under
  memory_mb = 512, and outside the jail's IPC namespace they outlived the engine. Where no memory cgroup bounds
  the job they would let one process hold any amount of the host's memory. Python never needs them;
- ptrace, process_vm_readv/writev, pidfd_getfd, kcmp: a candidate has no business with another process's memory
  or descriptors (bubblewrap's own init, once the jail's pid 1, was attached to this way and kept the job's pid
  namespace alive after the job). No candidate needs to trace;
- setxattr, lsetxattr, fsetxattr, setxattrat: user.* extended attributes on a tmpfs are kernel memory that
  neither RLIMIT_AS nor the tmpfs size counts (1.5 GiB held in 3 s under memory_mb = 256). shutil's copy
  functions ignore EPERM from them;
- io_uring_setup/enter/register: its operations (IORING_OP_SOCKET, ...) are never seen by seccomp, so it would
  undo every other rule here;
- unshare and clone with CLONE_NEWUSER: a user namespace gives its maker every capability inside it (new mount
  and network namespaces, mounts of its own), the widest door into kernel code a candidate could open;
- socket and socketpair, by `SocketRule`: socket buffers are kernel memory that RLIMIT_AS does not count. A v2
  memory cgroup charges them to the job; a v1 cgroup charges AF_UNIX buffers but not TCP's (measured: 1.5 GiB
  of loopback TCP buffers held under a 256 MiB v1 limit); without a cgroup nothing bounds them (4 processes
  held 944 MiB each under memory_mb = 512). So: all families with v2, AF_UNIX only with v1, none without.
clone3 fails with ENOSYS rather than EPERM: its flags sit in a struct that seccomp cannot read, and glibc falls
back to clone (whose flags it can) when the kernel says it has no clone3.

The filter is handed to bubblewrap (`--seccomp FD`) in the jail, and installed with prctl in the candidate's
process just before exec outside it (no_new_privs first, as an unprivileged process must).
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

CLONE_NEWUSER = 0x10000000
AF_UNIX = 1
ENOSYS = 38


class SocketRule(Enum):
    """Which sockets a candidate may make: what the job's memory bound can count."""

    ALL = "all"  # a v2 memory cgroup charges every socket buffer to the job
    UNIX_ONLY = "unix"  # a v1 memory cgroup charges AF_UNIX buffers, not TCP/UDP ones
    NONE = "none"  # no memory cgroup: nothing bounds socket buffers


@dataclass(frozen=True)
class _Numbers:
    arch: int
    denied: tuple[int, ...]
    clone: int
    unshare: int
    clone3: int
    socket: int
    socketpair: int


_MACHINES = {
    "x86_64": _Numbers(
        0xC000003E,
        (248, 249, 250, 319, 447, 29, 68, 64, 278, 425, 426, 427, 101, 310, 311, 312, 438, 188, 189, 190, 463),
        clone=56,
        unshare=272,
        clone3=435,
        socket=41,
        socketpair=53,
    ),
    "aarch64": _Numbers(
        0xC00000B7,
        (217, 218, 219, 279, 447, 194, 186, 190, 75, 425, 426, 427, 117, 270, 271, 272, 438, 5, 6, 7, 463),
        clone=220,
        unshare=97,
        clone3=435,
        socket=198,
        socketpair=199,
    ),
}
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_LD_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data; the low half of args[0] on little-endian


class _Program:
    """Classic BPF with named jump targets, resolved to the 8-bit forward offsets the kernel wants."""

    def __init__(self) -> None:
        self.ops: list[tuple[int, int, str | None, str | None]] = []
        self.labels: dict[str, int] = {}

    def op(self, code: int, k: int, jt: str | None = None, jf: str | None = None) -> None:
        self.ops.append((code, k, jt, jf))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.ops)

    def assemble(self) -> bytes:
        def offset(at: int, target: str | None) -> int:
            jump = 0 if target is None else self.labels[target] - at - 1
            assert 0 <= jump < 256, f"BPF jump to {target} out of reach"
            return jump

        return b"".join(
            struct.pack("HBBI", code, offset(i, jt), offset(i, jf), k) for i, (code, k, jt, jf) in enumerate(self.ops)
        )


def seccomp_program(sockets: SocketRule = SocketRule.NONE) -> bytes | None:
    """The filter for this machine, or None where its system call numbers are not known here."""
    numbers = _MACHINES.get(platform.machine())
    if numbers is None:
        return None
    p = _Program()
    p.op(_LD_ABS, _ARCH)
    p.op(_JEQ, numbers.arch, None, "eperm")  # another ABI (i386's int 0x80 numbers calls differently): refused
    p.op(_LD_ABS, _NR)
    if platform.machine() == "x86_64":
        p.op(_JGE, 0x40000000, "eperm", None)  # the x32 ABI
    for nr in numbers.denied:
        p.op(_JEQ, nr, "eperm", None)
    p.op(_JEQ, numbers.clone3, "enosys", None)
    p.op(_JEQ, numbers.clone, "newuser", None)
    p.op(_JEQ, numbers.unshare, "newuser", None)
    if sockets is not SocketRule.ALL:
        p.op(_JEQ, numbers.socket, "socket", None)
        p.op(_JEQ, numbers.socketpair, "socket", None)
    p.op(_RET, _ALLOW)
    p.label("newuser")  # (BPF jumps only forward: each test ends in its own `allow`)
    p.op(_LD_ABS, _ARG0)
    p.op(_JSET, CLONE_NEWUSER, "eperm", None)
    p.op(_RET, _ALLOW)
    p.label("socket")
    if sockets is SocketRule.UNIX_ONLY:
        p.op(_LD_ABS, _ARG0)
        p.op(_JEQ, AF_UNIX, None, "eperm")
        p.op(_RET, _ALLOW)
    p.label("eperm")
    p.op(_RET, _ERRNO | 1)
    p.label("enosys")
    p.op(_RET, _ERRNO | ENOSYS)
    return p.assemble()


def seccomp_fd(sockets: SocketRule = SocketRule.NONE) -> int | None:
    """A descriptor holding the filter, for `bwrap --seccomp FD` (bubblewrap reads it once); None when unknown."""
    program = seccomp_program(sockets)
    return None if program is None else memfd_holding("evolve-seccomp", program)


def memfd_holding(name: str, data: bytes) -> int:
    """An anonymous file holding `data`, positioned at its start (bubblewrap reads such files once)."""
    fd = os.memfd_create(name, 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


def installer(sockets: SocketRule) -> Callable[[], None] | None:
    """A callable that installs the filter in the calling process (a child between fork and exec), or None
    where the machine is unknown. Everything is allocated here, before the fork; the call raises on failure."""
    program = seccomp_program(sockets)
    if program is None:
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.addressof(buffer))

    def install() -> None:
        _ = buffer  # kept alive with the closure
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")

    return install
