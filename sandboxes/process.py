"""The process sandbox: a fresh, limited process per evaluation, for machines without Docker.

Containment, strongest first. With bubblewrap (sandboxes/jail.py) the candidate sees a minimal filesystem in
its own pid/network/IPC namespaces, and as root runs as its slot's own unprivileged uid (so RLIMIT_NPROC stops
fork bombs and every process of that uid that the engine started is killed afterwards; sandboxes/process_slots.py
keeps the uid this engine's alone). Without bubblewrap the host's files stay
readable: the sandbox says WEAK, and only the uid, an empty network namespace and rlimits remain; without root
the process group and every process that inherited the evaluation's token are killed. A candidate never runs
as root: an engine run as root that cannot hand it another uid (no jail, an interpreter other users cannot
reach) refuses to start. In every mode the seccomp filter of sandboxes/seccomp.py refuses user namespaces,
and the engine hides its own /proc entries from its candidates (sandboxes/engine_guard.py).

Memory: where the engine can make cgroups (root, or a delegated cgroup v2), each slot has a memory cgroup
(sandboxes/cgroups.py) that bounds all the job's processes and its tmpfs pages together, and an OOM in it makes
the job `memory`. Elsewhere RLIMIT_AS bounds each process alone, RLIMIT_NPROC their number, the scratch mounts
their sizes; what RLIMIT_AS cannot see is refused (memfds, SysV memory, sockets, pinned pipe pages: see
sandboxes/seccomp.py), and the kernel bounds pipe buffers per user. `isolation()` says which bound holds
(sandboxes/process_isolation.py words it).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
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

from evolve.filetree import TreeError
from evolve.problem import Problem
from evolve.problem.outcome import ErrorKind, EvalOutcome
from evolve.problem.trusted import scorer_pids
from sandboxes.abort import RunningJobs
from sandboxes.cgroups import make_slot_cgroups, remove_all
from sandboxes.cpu_share import InFlight, weight_env
from sandboxes.engine_guard import guard_engine
from sandboxes.jail import WORK, JobFiles, find_jail
from sandboxes.jail_watch import JailWatch, signal_name
from sandboxes.process_child import (
    CLONE_NEWNET,
    CLONE_NEWUSER,
    ChildSpec,
    candidate_env,
    checked_unshare,
    child_setup,
    cpu_limit_s,
    errno_text,
)
from sandboxes.process_isolation import Containment, describe
from sandboxes.process_slots import WORKDIR_PREFIX, Slot, SlotPool, remove_stale_workdirs
from sandboxes.sandbox import OUTPUT_CAP, SandboxRefused
from sandboxes.scoring import HARNESS_PATH, make_job, outcome_from, program_filename, program_files
from sandboxes.seccomp import SocketRule, installer
from sandboxes.sweep import kill_all
from sandboxes.toolchain import host_toolchain
from sandboxes.tree_layout import lay_out

PR_SET_CHILD_SUBREAPER = 36
REPLY_CAP = 8 * 1024 * 1024  # a dense JSON reply costs the engine ~10x its size in objects
GRACE_S = 1.0
# How a job ends whose jail was never made (its init never said so): bubblewrap refused it (e.g. a host file it
# hides under /usr vanished between the listing and the mount: no mount point can be made in the read-only /usr),
# or the init's own setup failed. Nothing of the candidate's ran.
JAIL_REFUSED = "jail refused"
BASE_UID = 61000
_libc = ctypes.CDLL(None, use_errno=True)


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


class ProcessSandbox:
    """`Sandbox` backed by one fresh process per evaluation."""

    kind = "process"

    def __init__(
        self,
        slots: int = 4,
        base_uid: int = BASE_UID,
        *,
        jail: bool = True,
        memory_cgroup: bool = True,
        nice: int = 0,
    ) -> None:
        self.nice = nice  # the candidates' CPU weight; 0, a run's, leaves it alone (sandboxes/cpu_share.py)
        self.evaluations_in_flight = InFlight()  # CountsEvaluations: the engine hands it to a decoding policy
        self._root = os.geteuid() == 0
        self._base_uid = base_uid
        self._jail, self._why_no_jail = find_jail() if jail else (None, "bubblewrap was turned off")
        self.hides_files = self._jail is not None
        # In the jail the interpreter is bound in wherever it lives; outside, other uids must reach it.
        interpreter_ok = self._jail is not None or (
            _reachable_by_others(Path(sys.executable)) and _reachable_by_others(Path(sys.base_prefix) / "lib")
        )
        self.drop_uid = self._root and interpreter_ok
        if self._root and not self.drop_uid:
            raise SandboxRefused(
                f"process sandbox: WEAK ({self._why_no_jail}) and, as root, it could only run candidates as root "
                f"({sys.executable} is not reachable by other users); install bubblewrap (apt-get install "
                "bubblewrap), or run evolve as a non-root user"
            )
        guard_engine(shares_proc=self._jail is None)
        # Outside the jail, orphans of a candidate are re-parented to us rather than to PID 1, so we can reap
        # them at once and they never count against the slot's process limit as zombies. (In the jail the pid
        # namespace's first process is their reaper.)
        if self._jail is None and _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            raise SandboxRefused(f"process sandbox: prctl(PR_SET_CHILD_SUBREAPER) failed: {errno_text()}")
        remove_stale_workdirs()
        self._pool = SlotPool(slots, base_uid if self.drop_uid else None)
        self._cgroups, self._why_no_cgroup = (
            make_slot_cgroups(self._pool.lanes) if memory_cgroup else ({}, "memory cgroups were turned off")
        )
        self.bounds_job_memory = bool(self._cgroups)
        v2 = bool(self._cgroups) and next(iter(self._cgroups.values())).v2
        # Socket buffers are kernel memory RLIMIT_AS does not see: a candidate gets the sockets its bound counts.
        self.sockets = SocketRule.ALL if v2 else SocketRule.UNIX_ONLY if self._cgroups else SocketRule.NONE
        # Removed at close, or at exit when never closed (after kill -9, by the next engine's start).
        self._remove_cgroups = weakref.finalize(self, remove_all, list(self._cgroups.values()))
        self.network_isolated = self._jail is not None or self._probe_netns()
        self._running = RunningJobs()  # for abort_running(): each job's first process, killed on Ctrl-C
        # WEAK without root: leftovers keep our uid and may shed the token, but as subreaper we adopt them.
        # The leaders of running jobs are spared; the lock keeps a leader from being seen before it is listed.
        self._adopts_leftovers = self._jail is None and not self.drop_uid
        self._leaders: set[int] = set()
        self._spawn_lock = threading.Lock()

    @property
    def cgroup_paths(self) -> tuple[Path, ...]:
        """The memory cgroup folder of each slot (none without a memory bound, or once closed)."""
        return tuple(c.path for c in self._cgroups.values())

    @property
    def slot_uids(self) -> tuple[int, ...]:
        """The uids this sandbox's candidates run as (one per slot it holds now); empty where they keep ours."""
        return self._pool.uids

    def _unshare_flags(self) -> int:
        return CLONE_NEWNET if self._root else CLONE_NEWUSER | CLONE_NEWNET

    def _probe_netns(self) -> bool:
        flags = self._unshare_flags()
        try:
            out = subprocess.run(
                [sys.executable, "-I", "-c", "import os; print(os.readlink('/proc/self/ns/net'))"],
                preexec_fn=lambda: checked_unshare(flags),
                capture_output=True,
                text=True,
                timeout=30,
            )
        except subprocess.SubprocessError:
            return False
        return out.returncode == 0 and out.stdout.strip() != os.readlink("/proc/self/ns/net")

    def isolation(self) -> str:
        return describe(
            Containment(
                jailed=self._jail is not None,
                why_no_jail=self._why_no_jail,
                drop_uid=self.drop_uid,
                base_uid=self._base_uid,
                network_isolated=self.network_isolated,
                nice=self.nice,
                sockets=self.sockets,
                memory_cgroups=bool(self._cgroups),
                why_no_cgroup=self._why_no_cgroup,
            )
        )

    def close(self) -> None:
        self._remove_cgroups()
        self._cgroups = {}
        self._pool.close()

    def abort_running(self) -> None:
        """Ctrl-C: kill every job in flight (its process group; the usual sweep after it ends takes the rest)."""
        self._running.abort_all()

    def evaluate(self, problem: Problem, code: str) -> EvalOutcome:
        ticket = self._running.ticket()
        slot = self._pool.take()
        try:
            if self._running.aborted(ticket):  # aborted while waiting for a slot: nothing ran
                outcome = EvalOutcome.failure(problem, ErrorKind.CRASH, "aborted before it ran", 0.0, self.kind)
            else:
                with self.evaluations_in_flight.running():
                    outcome = self._evaluate(problem, code, slot, ticket)
            outcome.aborted = self._running.aborted(ticket)
            return outcome
        finally:
            self._pool.give(slot)

    def _evaluate(self, problem: Problem, code: str, slot: Slot, ticket: int) -> EvalOutcome:
        uid = slot.uid
        workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")
        token = secrets.token_hex(12)
        start = time.monotonic()
        try:
            try:
                files = program_files(problem, code)
            except TreeError as exc:
                return EvalOutcome.failure(problem, ErrorKind.INVALID, str(exc), 0.0, self.kind)
            program = Path(workdir, program_filename(problem))
            files["_evolve_harness.py"] = HARNESS_PATH.read_text()
            evaluator = None
            if problem.form == "simple":
                files["_evolve_evaluator.py"] = problem.evaluator_path.read_text()
                evaluator = str(Path(workdir, "_evolve_evaluator.py"))
            lay_out(workdir, files, uid)
            inside = WORK if self._jail is not None else workdir  # in the jail its work dir is bound at /work
            if self._jail is not None:
                entry = program_filename(problem)
                program, evaluator = Path(inside, entry), evaluator and f"{inside}/_evolve_evaluator.py"
            tools = host_toolchain(problem, inside=bool(self._jail))
            job = make_job(problem, str(program), evaluator, inside, tools, code=code)
            reply, stdout, stderr, status = self._run(problem, job, workdir, slot, token, ticket)
            if status == JAIL_REFUSED:  # nothing of the candidate ran: the jail is made once more, listed again
                reply, stdout, stderr, status = self._run(problem, job, workdir, slot, token, ticket)
            if status == JAIL_REFUSED:  # twice: the host's fault, not the candidate's (the loop stops on a streak)
                said = stderr.decode(errors="replace").strip()[-300:] or "no message"
                raise SandboxRefused(f"process sandbox: the jail could not be made, twice ({said})")
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        out, err = stdout.decode(errors="replace"), stderr.decode(errors="replace")
        return outcome_from(problem, reply, status, out, err, time.monotonic() - start, self.kind)

    def _run(
        self, problem: Problem, job: dict[str, Any], workdir: str, slot: Slot, token: str, ticket: int
    ) -> tuple[Any, bytes, bytes, str]:
        uid, cgroup = slot.uid, self._cgroups.get(slot.lane)
        if cgroup is not None:
            try:
                cgroup.prepare(problem.config.sandbox_limits.memory_mb << 20)
            except OSError as exc:
                raise SandboxRefused(f"process sandbox: cannot set up the memory cgroup {cgroup.path}: {exc}") from exc
        reply_r, reply_w = os.pipe()
        command = [sys.executable, "-I", "-B", "_evolve_harness.py", str(reply_w)]
        files = JobFiles()
        jailed = self._jail is not None
        watch = None
        if self._jail is not None:
            run_as, nproc = str(uid) if uid is not None else "-", str(problem.config.limits.max_processes)
            files = self._jail.job_files(self.sockets, host_toolchain(problem).binds)
            command = self._jail.argv(workdir, problem.data_dir, [*command[1:], run_as, nproc], files, reply_w)
            assert files.pipes is not None
            watch = JailWatch(files.pipes)
        spec = ChildSpec(
            problem,
            uid,
            cgroup,
            self._unshare_flags() if self.network_isolated and not jailed else 0,
            jailed,
            None if jailed else installer(self.sockets),
            self.nice,
        )
        # Only where leftovers are swept by adoption must a new leader be listed before a sweep can see it.
        spawn_guard = self._spawn_lock if self._adopts_leftovers else contextlib.nullcontext()
        try:
            with spawn_guard:
                proc = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=(reply_w, *files.fds),
                    cwd=workdir,
                    env=candidate_env(problem, workdir, token, jailed) | weight_env(self.nice),
                    start_new_session=True,
                    preexec_fn=child_setup(spec),
                )
                self._leaders.add(proc.pid)
        except (OSError, subprocess.SubprocessError) as exc:
            os.close(reply_r)
            if watch is not None:
                watch.close()
            raise SandboxRefused(f"process sandbox: could not set up the candidate's process: {exc}") from exc
        finally:
            os.close(reply_w)
            files.close()
        try:
            return self._watch(problem, proc, job, reply_r, watch, cgroup, uid, token, ticket)
        finally:
            if watch is not None:
                watch.close()

    def _watch(
        self,
        problem: Problem,
        proc: subprocess.Popen[bytes],
        job: dict[str, Any],
        reply_r: int,
        watch: JailWatch | None,
        cgroup: Any,
        uid: int | None,
        token: str,
        ticket: int,
    ) -> tuple[Any, bytes, bytes, str]:
        """Feed the job, wait for its end or deadline, end everything it started, and say how it ended."""
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
        if watch is not None:
            watch.attach()

        def abort() -> None:
            os.killpg(proc.pid, signal.SIGKILL)
            if watch is not None:
                watch.end()

        # Popen.wait(timeout) polls with sleeps of up to 50 ms; a pidfd wakes us the instant it exits.
        pidfd = os.pidfd_open(proc.pid)
        try:
            with self._running.running(ticket, abort):
                ready, _, _ = select.select([pidfd], [], [], problem.config.sandbox_limits.timeout_s + GRACE_S)
        finally:
            os.close(pidfd)
        if watch is not None:  # the whole pid namespace, whatever the job did to its init
            watch.end()
        status, refused = "timeout", False
        if ready:
            code = proc.wait()
            status = f"exit {code}" if code >= 0 else f"signal {signal_name(-code)}"
            words = watch.words() if watch is not None else None
            if words is not None and words.report is not None:  # the init saw the harness end: its exact status
                status = words.report.status(cpu_limit_s(problem))
            refused = words is not None and not words.started and not self._running.aborted(ticket)
        if cgroup is not None:
            cgroup.kill()
        if self._adopts_leftovers:
            with self._spawn_lock:
                spared = frozenset(self._leaders) | scorer_pids()  # jobs running; the evaluator's score() processes
                kill_all(proc.pid, None, token.encode(), adopted_except=spared)
        else:
            kill_all(proc.pid, uid, None if uid is not None else token.encode())
        proc.wait()
        self._leaders.discard(proc.pid)
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
        if refused:  # bubblewrap ended before the init said the jail was made
            status = JAIL_REFUSED
        if status == "signal SIGXCPU" and watch is None:  # outside the jail: the process's own CPU limit
            status = "timeout"
        return reply, b"".join(sinks["out"]), b"".join(sinks["err"]), status
