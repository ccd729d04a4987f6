"""The first process of a job's jail (pid 1 of its pid namespace): bounds the scratch mounts' inodes, keeps
itself out of the candidate's reach, starts the harness, and reports exactly how it ended.

Stdlib only: bubblewrap runs it as `python -I -S -c <this file> STATUS_FD KEEP_FD MOUNTS -- HARNESS...`.

Why not bubblewrap's own init: without root it runs with the candidate's uid and stays dumpable, so a candidate
could write its memory through /proc/1/mem (no ptrace needed), make it report a clean exit to bubblewrap, clear
its parent-death signal and keep the pid namespace, CPU burners and all, alive after the job and the engine.
This one makes itself non-dumpable before anything of the candidate exists: its /proc entries then belong to
root, and nothing without CAP_SYS_PTRACE over it can open its memory, descriptors or environment. As the
namespace's init it gets no signal from inside that it has no handler for, and it installs none.

It also does what only a process inside the jail's mount namespace can: remount each scratch tmpfs with an
inode limit (bubblewrap sets sizes only). Empty files cost no blocks, only inode and dentry memory, which neither
a tmpfs size nor RLIMIT_AS counts: without a memory cgroup, 742,000 empty files held 1.1 GB of kernel memory.
CAP_SYS_ADMIN, which bubblewrap grants for this alone, is dropped before the harness starts.

Its first line on STATUS_FD says that the jail is made, just before the harness starts (a job without it never ran
anything of the candidate's: bubblewrap or this init could not make the jail). Its report (one JSON line after it)
is the engine's observation of the job: the harness's real wait status (bubblewrap folds a death by signal N into
exit code 128+N, so a candidate that exited with 137 looked killed) and the CPU seconds of every process it reaped
(a death by SIGXCPU is a timeout only if the CPU was spent).
"""

import ctypes
import json
import os
import signal
import sys

PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 4, 24, 47, 4
MS_NOSUID, MS_NODEV, MS_REMOUNT = 2, 4, 32
CAP_SETGID, CAP_SETUID = 6, 7
CAPABILITY_VERSION_3 = 0x20080522
LAST_CAP = 63
EXIT_SETUP_FAILED = 126
JAIL_MADE = b"jail\n"  # its first words on STATUS_FD, once the jail is made, just before the harness starts
libc = ctypes.CDLL(None, use_errno=True)


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def fail(what):
    """A jail that cannot be made as asked is not run weaker: bubblewrap exits non-zero, the probe says why."""
    sys.stderr.write(f"jail init: {what}: {os.strerror(ctypes.get_errno())}\n")
    os._exit(EXIT_SETUP_FAILED)


def bound_inodes(mounts):
    """Remount each scratch tmpfs ("path=inodes", comma-separated) with that many inodes at most."""
    for item in filter(None, mounts.split(",")):
        path, _, inodes = item.rpartition("=")
        flags = MS_REMOUNT | MS_NOSUID | MS_NODEV  # the flags bubblewrap mounted it with, kept
        if libc.mount(b"tmpfs", path.encode(), b"tmpfs", flags, f"nr_inodes={int(inodes)}".encode()) != 0:
            fail(f"cannot bound the inodes of {path}")


def drop_capabilities():
    """Keep only what the harness needs: as root, CAP_SETUID and CAP_SETGID to become the slot's uid; else none.
    The bounding set goes too, so that no later exec gets any other back."""
    keep = (1 << CAP_SETUID) | (1 << CAP_SETGID) if os.getuid() == 0 else 0
    for cap in range(LAST_CAP + 1):
        if not keep >> cap & 1 and libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:
            fail(f"cannot drop capability {cap} from the bounding set")  # EINVAL (22): past the kernel's last
    if libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        fail("cannot clear the ambient capabilities")
    data = (CapData * 2)(CapData(keep, keep, 0), CapData(0, 0, 0))
    if libc.capset(ctypes.byref(CapHeader(CAPABILITY_VERSION_3, 0)), data) != 0:
        fail("cannot drop capabilities")


def close_inherited(keep):
    """Every descriptor bubblewrap let through but stdio and `keep` is closed (bubblewrap's --info-fd among them)."""
    last = 3
    for fd in sorted(fd for fd in keep if fd >= last):
        os.closerange(last, fd)
        last = fd + 1
    os.closerange(last, 1 << 16)


def start(argv):
    pid = os.fork()
    if pid == 0:
        try:
            for number in (signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ):  # Python's own, not the harness's
                signal.signal(number, signal.SIG_DFL)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    return pid


def reap_until(pid):
    """Reap every process that ends (orphans come to init) until `pid` does; its wait status, and the CPU
    seconds of everything reaped (each process's own and its reaped children's)."""
    cpu_s = 0.0
    while True:
        try:
            reaped, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            return None, cpu_s
        cpu_s += usage.ru_utime + usage.ru_stime
        if reaped == pid:
            return status, cpu_s


def main():
    status_fd, keep_fd, mounts = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        fail("cannot make itself non-dumpable")
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    harness = sys.argv[sys.argv.index("--") + 1 :]
    bound_inodes(mounts)
    drop_capabilities()
    close_inherited({status_fd, keep_fd})
    os.set_inheritable(status_fd, False)
    if keep_fd >= 0:
        os.set_inheritable(keep_fd, True)
    os.write(status_fd, JAIL_MADE)  # the jail is made; nothing of the candidate's has run before this line
    pid = start(harness)
    if keep_fd >= 0:
        os.close(keep_fd)  # the harness's reply pipe: EOF for the engine as soon as the harness is gone
    status, cpu_s = reap_until(pid)
    if status is None:
        report = {"lost": True, "cpu_s": cpu_s}
    elif os.WIFSIGNALED(status):
        report = {"signal": os.WTERMSIG(status), "cpu_s": cpu_s}
    else:
        report = {"exit": os.waitstatus_to_exitcode(status), "cpu_s": cpu_s}
    os.write(status_fd, (json.dumps(report) + "\n").encode())
    os._exit(0)  # and the kernel kills whatever the job left in this pid namespace


if __name__ == "__main__":
    main()
