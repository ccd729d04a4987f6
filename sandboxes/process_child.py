"""The candidate's process as the process sandbox starts it: its limits, namespaces, filter and environment.

Everything here runs in the child between fork and exec (or is handed to it): any refusal raises, so Popen
fails instead of running the candidate weaker than the sandbox said.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from collections.abc import Callable
from dataclasses import dataclass

from evolve.problem import Problem
from sandboxes.cgroups import SlotCgroup
from sandboxes.cpu_share import lower_cpu_weight
from sandboxes.jail import DATA, WORK

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
PR_SET_PDEATHSIG = 1
NOFILE = 256  # descriptors per process: each can hold kernel memory (a pipe's or socket's buffer)
_libc = ctypes.CDLL(None, use_errno=True)


def errno_text() -> str:
    return os.strerror(ctypes.get_errno())


def checked_unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), f"unshare({flags:#x}) failed: {errno_text()}")


@dataclass(frozen=True)
class ChildSpec:
    """What the child applies to itself: the problem's limits, the slot's uid (None: keep ours) and cgroup."""

    problem: Problem
    uid: int | None
    cgroup: SlotCgroup | None
    unshare_flags: int  # outside the jail: the namespaces to make (the jail makes its own)
    jailed: bool
    install_filter: Callable[[], None] | None  # outside the jail: sandboxes.seccomp.installer(...)
    nice: int = 0  # the candidate's CPU weight (sandboxes/cpu_share.py); in the jail its init sets its autogroup's


def cpu_limit_s(problem: Problem) -> int:
    """The soft RLIMIT_CPU of a candidate's processes (SIGXCPU); the hard one, a second later, is SIGKILL."""
    return int(problem.config.sandbox_limits.timeout_s) + 2


def child_setup(spec: ChildSpec) -> Callable[[], None]:
    """The preexec_fn for one candidate's process."""
    limits = spec.problem.config.sandbox_limits  # a build and its program, one after the other
    mem = max(limits.memory_mb, 256) * 1024 * 1024
    cpu = cpu_limit_s(spec.problem)
    engine = os.getpid()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nofile = NOFILE if hard == resource.RLIM_INFINITY else min(NOFILE, hard)
    uid, cgroup = spec.uid, spec.cgroup

    def setup() -> None:
        # An engine killed with SIGKILL takes its candidates along: none runs on, unaccounted for.
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != engine:
            os._exit(1)
        if spec.nice:  # before the uid changes: the process is then no longer dumpable, /proc/self/autogroup root's
            lower_cpu_weight(spec.nice)
        if cgroup is not None:  # in the slot's memory cgroup before anything of the job runs
            cgroup.join()
        if spec.unshare_flags:
            checked_unshare(spec.unshare_flags)
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_mb << 20,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
        if uid is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes,) * 2)
            if not spec.jailed:  # in the jail the harness drops to `uid` itself, once the mounts are made
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a change of credentials clears it
        if spec.install_filter is not None:  # last: nothing above may be refused by it
            spec.install_filter()

    return setup


def candidate_env(problem: Problem, workdir: str, token: str, jailed: bool) -> dict[str, str]:
    """The whole environment a candidate gets: nothing of the engine's but two OpenBLAS tuning knobs."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": WORK if jailed else workdir,
        "TMPDIR": "/tmp" if jailed else workdir,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "EVOLVE_SANDBOX_TOKEN": token,
    }
    for keep in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
        if keep in os.environ:
            env[keep] = os.environ[keep]
    if problem.data_dir is not None:
        env["EVOLVE_DATA_DIR"] = DATA if jailed else str(problem.data_dir)
    return env
