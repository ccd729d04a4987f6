"""The process sandbox: a fresh, limited process per evaluation, for machines without Docker.

Containment, strongest first. With bubblewrap (sandboxes/jail.py) the candidate sees a minimal filesystem in
its own pid/network/IPC namespaces, and as root runs as its slot's own unprivileged uid (so RLIMIT_NPROC stops
fork bombs and every process of that uid is killed afterwards). Without bubblewrap the host's files stay
readable: the sandbox says WEAK, and only the uid, an empty network namespace and rlimits remain; without root
the process group and every process that inherited the evaluation's token are killed.

Memory: where the engine can make cgroups (root, or a delegated cgroup v2), each slot has a memory cgroup
(sandboxes/cgroups.py) that bounds all the job's processes and its tmpfs pages together, and an OOM in it makes
the job `memory`. Elsewhere RLIMIT_AS bounds each process alone; the jail refuses memfd_create and shmget, whose
memory RLIMIT_AS cannot see, and RLIMIT_NOFILE bounds what descriptors can hold.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import queue
import resource
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from evolve.problem import Problem
from sandboxes.abort import RunningJobs
from sandboxes.base import OUTPUT_CAP, ErrorKind, EvalOutcome, SandboxRefused
from sandboxes.cgroups import SlotCgroup, make_slot_cgroups, remove_all
from sandboxes.jail import DATA, WORK, find_jail, seccomp_fd
from sandboxes.scoring import HARNESS_PATH, make_job, outcome_from, program_filename
from sandboxes.sweep import kill_all

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
REPLY_CAP = 8 * 1024 * 1024  # a dense JSON reply costs the engine ~10x its size in objects
GRACE_S = 1.0
NOFILE = 256  # descriptors per process: each can hold kernel memory (a pipe's or socket's buffer)
WORKDIR_PREFIX = "evolve-eval-"
BASE_UID = 61000
UID_RANGE = 1024
LOCK_DIR = Path(tempfile.gettempdir()) / "vpo-evolve-slots"
_libc = ctypes.CDLL(None, use_errno=True)


def _errno() -> str:
    return os.strerror(ctypes.get_errno())


def _checked_unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        raise OSError(ctypes.get_errno(), f"unshare({flags:#x}) failed: {_errno()}")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def _reachable_by_others(path: Path) -> bool:
    """True when a uid with no special rights can traverse to `path` and read it."""
    path = path.resolve()
    for parent in path.parents:
        if not os.stat(parent).st_mode & stat.S_IXOTH:
            return False
    return bool(os.stat(path).st_mode & stat.S_IROTH)


def _read_capped(stream: Any, cap: int, sink: list[bytes]) -> None:
    """Keep the first `cap` bytes, drain and drop the rest so the writer never blocks on us."""
    kept = 0
    while chunk := stream.read(65536):
        if kept < cap:
            sink.append(chunk[: cap - kept])
            kept += len(sink[-1])
    stream.close()


def _claim_slots(count: int) -> dict[int, int]:
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


def _remove_stale_workdirs() -> None:
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


class ProcessSandbox:
    """`Sandbox` backed by one fresh process per evaluation."""

    kind = "process"

    def __init__(
        self, slots: int = 4, base_uid: int = BASE_UID, *, jail: bool = True, memory_cgroup: bool = True
    ) -> None:
        self._root = os.geteuid() == 0
        self._base_uid = base_uid
        self._jail, self._why_no_jail = find_jail() if jail else (None, "bubblewrap was turned off")
        self.hides_files = self._jail is not None
        # Outside the jail, orphans of a candidate are re-parented to us rather than to PID 1, so we can reap
        # them at once and they never count against the slot's process limit as zombies. (In the jail the pid
        # namespace's first process is their reaper.)
        if self._jail is None and _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise SandboxRefused(f"process sandbox: prctl(PR_SET_CHILD_SUBREAPER) failed: {_errno()}")
        _remove_stale_workdirs()
        self._slot_locks = _claim_slots(slots)
        self._cgroups, self._why_no_cgroup = (
            make_slot_cgroups(list(self._slot_locks)) if memory_cgroup else ({}, "memory cgroups were turned off")
        )
        self.bounds_job_memory = bool(self._cgroups)
        # Removed at close, or at exit when never closed (after kill -9, by the next engine's start).
        self._remove_cgroups = weakref.finalize(self, remove_all, list(self._cgroups.values()))
        self._slots: queue.Queue[int] = queue.Queue()
        for i in self._slot_locks:
            self._slots.put(i)
        # In the jail the interpreter is bound in wherever it lives; outside, other uids must reach it.
        interpreter_ok = self._jail is not None or (
            _reachable_by_others(Path(sys.executable)) and _reachable_by_others(Path(sys.base_prefix) / "lib")
        )
        self.drop_uid = self._root and interpreter_ok
        self._why_no_drop = (
            ""
            if self.drop_uid or not self._root
            else f"{sys.executable} is not reachable by other uids; install bubblewrap"
        )
        self.network_isolated = self._jail is not None or self._probe_netns()
        self._running = RunningJobs()  # for abort_running(): each job's first process, killed on Ctrl-C

    @property
    def slot_uids(self) -> tuple[int, ...]:
        """The uids this sandbox's candidates run as (one per slot it holds); empty where they keep ours."""
        return tuple(self._base_uid + slot for slot in self._slot_locks) if self.drop_uid else ()

    def _unshare_flags(self) -> int:
        return CLONE_NEWNET if self._root else CLONE_NEWUSER | CLONE_NEWNET

    def _probe_netns(self) -> bool:
        flags = self._unshare_flags()
        try:
            out = subprocess.run(
                [sys.executable, "-I", "-c", "import os; print(os.readlink('/proc/self/ns/net'))"],
                preexec_fn=lambda: _checked_unshare(flags),
                capture_output=True,
                text=True,
                timeout=30,
            )
        except subprocess.SubprocessError:
            return False
        return out.returncode == 0 and out.stdout.strip() != os.readlink("/proc/self/ns/net")

    def isolation(self) -> str:
        if self._jail is not None:
            who = f"per-slot uid {self._base_uid}+" if self.drop_uid else "your uid in a user namespace"
            return (
                f"process sandbox (bubblewrap): {who}; sees only read-only /usr and Python, its own /work, "
                "data/ read-only, private /tmp and /proc; own pid/network/IPC namespaces; "
                f"rlimits on CPU/files/processes, scrubbed env; {self._memory_bound()}"
            )
        parts = [f"process sandbox: WEAK: candidates can read the host's files ({self._why_no_jail});"]
        if self.drop_uid:
            parts.append(f"per-slot uid {self._base_uid}+,")
        elif self._root:
            parts.append(f"runs as root ({self._why_no_drop}),")
        else:
            parts.append("runs as your user (no uid separation),")
        parts.append("no network namespace," if not self.network_isolated else "empty network namespace,")
        parts.append(f"rlimits on CPU/files/processes, scrubbed env, private temp dir; {self._memory_bound()}")
        return " ".join(parts)

    def _memory_bound(self) -> str:
        if self._cgroups:
            version = "v2" if next(iter(self._cgroups.values())).v2 else "v1"
            return f"memory: one cgroup ({version}) per job bounds all its processes and temp files together"
        refused = "; memfd_create and shmget refused" if self._jail is not None else ""
        return f"memory: bounded per process only (RLIMIT_AS; no memory cgroup: {self._why_no_cgroup}){refused}"

    def close(self) -> None:
        self._remove_cgroups()
        self._cgroups = {}
        for fd in self._slot_locks.values():
            os.close(fd)
        self._slot_locks = {}

    def _preexec(self, problem: Problem, uid: int | None, cgroup: SlotCgroup | None) -> Any:
        """Limits set in the child before exec; any refusal raises, so Popen fails instead of running weaker."""
        limits = problem.config.limits
        flags = self._unshare_flags() if self.network_isolated and self._jail is None else 0
        mem = max(limits.memory_mb, 256) * 1024 * 1024
        cpu = int(limits.timeout_s) + 2
        engine = os.getpid()
        jailed = self._jail is not None
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nofile = NOFILE if hard == resource.RLIM_INFINITY else min(NOFILE, hard)

        def setup() -> None:
            # An engine killed with SIGKILL takes its candidates along: none runs on, unaccounted for.
            _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != engine:
                os._exit(1)
            if cgroup is not None:  # in the slot's memory cgroup before anything of the job runs
                cgroup.join()
            if flags:
                _checked_unshare(flags)
            resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
            resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_mb << 20,) * 2)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))
            if uid is not None:
                resource.setrlimit(resource.RLIMIT_NPROC, (limits.max_processes,) * 2)
                if not jailed:  # in the jail the harness drops to `uid` itself, once the mounts are made
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
                    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # a change of credentials clears it

        return setup

    def _env(self, problem: Problem, workdir: str, token: str) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": workdir,
            "TMPDIR": workdir,
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
            env["EVOLVE_DATA_DIR"] = DATA if self._jail is not None else str(problem.data_dir)
        if self._jail is not None:
            env["HOME"], env["TMPDIR"] = WORK, "/tmp"
        return env

    def abort_running(self) -> None:
        """Ctrl-C: kill every job in flight (its process group; the usual sweep after it ends takes the rest)."""
        self._running.abort_all()

    def evaluate(self, problem: Problem, code: str) -> EvalOutcome:
        ticket = self._running.ticket()
        slot = self._slots.get()
        try:
            if self._running.aborted(ticket):  # aborted while waiting for a slot: nothing ran
                outcome = EvalOutcome.failure(problem, ErrorKind.CRASH, "aborted before it ran", 0.0, self.kind)
            else:
                outcome = self._evaluate(problem, code, slot, ticket)
            outcome.aborted = self._running.aborted(ticket)
            return outcome
        finally:
            self._slots.put(slot)

    def _evaluate(self, problem: Problem, code: str, slot: int, ticket: int) -> EvalOutcome:
        uid = self._base_uid + slot if self.drop_uid else None
        workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")
        token = secrets.token_hex(12)
        start = time.monotonic()
        try:
            program = Path(workdir, program_filename(problem))
            program.write_text(code)
            shutil.copy(HARNESS_PATH, Path(workdir, "_evolve_harness.py"))
            evaluator = None
            if problem.form == "simple":
                evaluator = str(shutil.copy(problem.evaluator_path, Path(workdir, "_evolve_evaluator.py")))
            if uid is not None:
                for p in Path(workdir).iterdir():
                    os.chown(p, uid, uid)
                os.chown(workdir, uid, uid)
            os.chmod(workdir, 0o700)
            if self._jail is not None:  # the paths the candidate sees: its work dir is bound at /work
                inside = WORK
                program, evaluator = Path(inside, program.name), evaluator and f"{inside}/_evolve_evaluator.py"
            else:
                inside = workdir
            job = make_job(problem, str(program), evaluator, inside)
            reply, stdout, stderr, status = self._run(problem, job, workdir, slot, token, ticket)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        out, err = stdout.decode(errors="replace"), stderr.decode(errors="replace")
        return outcome_from(problem, reply, status, out, err, time.monotonic() - start, self.kind)

    def _run(
        self, problem: Problem, job: dict[str, Any], workdir: str, slot: int, token: str, ticket: int
    ) -> tuple[Any, bytes, bytes, str]:
        uid = self._base_uid + slot if self.drop_uid else None
        cgroup = self._cgroups.get(slot)
        if cgroup is not None:
            try:
                cgroup.prepare(problem.config.limits.memory_mb << 20)
            except OSError as exc:
                raise SandboxRefused(f"process sandbox: cannot set up the memory cgroup {cgroup.path}: {exc}") from exc
        reply_r, reply_w = os.pipe()
        command = [sys.executable, "-I", "-B", "_evolve_harness.py", str(reply_w)]
        seccomp = None
        if self._jail is not None:
            run_as, nproc = str(uid) if uid is not None else "-", str(problem.config.limits.max_processes)
            seccomp = seccomp_fd()
            command = self._jail.argv(workdir, problem.data_dir, [*command, run_as, nproc], seccomp)
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(reply_w,) if seccomp is None else (reply_w, seccomp),
                cwd=workdir,
                env=self._env(problem, WORK if self._jail is not None else workdir, token),
                start_new_session=True,
                preexec_fn=self._preexec(problem, uid, cgroup),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            os.close(reply_r)
            raise SandboxRefused(f"process sandbox: could not set up the candidate's process: {exc}") from exc
        finally:
            os.close(reply_w)
            if seccomp is not None:
                os.close(seccomp)
        sinks: dict[str, list[bytes]] = {"out": [], "err": [], "reply": []}
        threads = [
            threading.Thread(target=_read_capped, args=(s, cap, sinks[k]), daemon=True)
            for k, s, cap in (
                ("out", proc.stdout, OUTPUT_CAP),
                ("err", proc.stderr, OUTPUT_CAP),
                ("reply", os.fdopen(reply_r, "rb"), REPLY_CAP),
            )
        ]
        for t in threads:
            t.start()
        try:
            assert proc.stdin is not None
            proc.stdin.write((json.dumps(job) + "\n").encode())
            proc.stdin.close()
        except OSError:
            pass
        # Popen.wait(timeout) polls with sleeps of up to 50 ms; a pidfd wakes us the instant it exits.
        pidfd = os.pidfd_open(proc.pid)
        try:
            with self._running.running(ticket, lambda: os.killpg(proc.pid, signal.SIGKILL)):
                ready, _, _ = select.select([pidfd], [], [], problem.config.limits.timeout_s + GRACE_S)
        finally:
            os.close(pidfd)
        if ready:
            code = proc.wait()
            if self._jail is not None and code > 128:  # bubblewrap reports a child killed by signal N as 128+N
                code = 128 - code
            status = f"exit {code}" if code >= 0 else f"signal {_signal_name(-code)}"
        else:
            status = "timeout"
        if cgroup is not None:
            cgroup.kill()
        kill_all(proc.pid, uid, None if uid is not None else token.encode())
        proc.wait()
        if cgroup is not None and cgroup.oom_killed():  # one of the job's processes, maybe not the first
            status = "memory"
        for t in threads:
            t.join(timeout=2.0)
        raw = b"".join(sinks["reply"])
        try:
            reply = json.loads(raw) if raw else None
        except (ValueError, RecursionError):  # a deeply nested reply must not escape evaluate()
            reply = {"kind": "bad_output", "error": "the reply was not JSON (or nested too deeply)"}
        del raw
        if status == "signal SIGXCPU":
            status = "timeout"
        return reply, b"".join(sinks["out"]), b"".join(sinks["err"]), status
