"""The Docker sandbox: a warm pool of locked-down containers, one job at a time each.

Each container runs `container_runner.py` as its main process (behind Docker's init) and talks JSON lines
over the attached stdin/stdout. The engine keeps its own deadline on every request; a container that
misses it, dies, or answers garbage is destroyed and replaced, and the evaluation gets an error kind.

Each container has its own pid namespace: the job killer's kill(-1) in it reaches no host process and no other
container, whatever their uid. An engine removes its own containers and those of engines it sees are dead.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import secrets
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any

from evolve.filetree import TreeError
from evolve.problem import Problem
from evolve.problem.outcome import ErrorKind, EvalOutcome
from sandboxes.abort import RunningJobs
from sandboxes.docker_images import ImageSpec, image_for, image_toolchain, memory_cap_mb, runtime_env, work_mount
from sandboxes.host_config import empty_file, hidden_host_config, hidden_host_files
from sandboxes.jail import SCRATCH_INODES
from sandboxes.sandbox import SandboxRefused
from sandboxes.scoring import make_job, outcome_from, program_filename, program_files

SANDBOX_DIR = Path(__file__).resolve().parent
GRACE_S = 5.0
OWNER = f"{socket.gethostname()}:{os.getpid()}"
# OWNER's pid namespace: an engine in another (a container sharing the daemon and hostname) has pids we cannot see
PID_NAMESPACE = str(os.stat("/proc/self/ns/pid").st_ino)
# For a runner to say it is ready: a second or two when idle, far more under load (one that ended says so at once)
READY_WAIT_S = 120.0
LINE_CAP = 24 * 1024 * 1024  # the runner's answer: an 8 MiB reply plus capped output, JSON-escaped
UNEXPECTED = object()  # a line on the channel that is not the answer to the job just sent


def _runner_failed(answer: object) -> bool:
    return isinstance(answer, dict) and str(answer.get("status", "")).startswith("runner error")


def docker_available() -> str | None:
    """None when a daemon answers, else why not."""
    try:
        import docker

        docker.from_env(timeout=5).ping()
        return None
    except Exception as exc:
        return f"no Docker daemon answers ({type(exc).__name__})"


class WarmContainer:
    def __init__(self, client: Any, spec: ImageSpec, problem: Problem, spawn: bool) -> None:
        from docker.types import LogConfig, Mount, Ulimit

        limits = problem.config.sandbox_limits  # a build and its program, one after the other
        # (host, inside) pairs, not a dict keyed by host: one host folder may be needed at two places (the engine's
        # Python at /opt/python and, when a build starts it, at /opt/toolchain/0), and keyed by host the last one
        # dropped the first: no container could start its runner.
        binds = [*spec.binds.items(), *image_toolchain(spec, problem).binds]
        volumes = [(str(SANDBOX_DIR), "/opt/evolve"), *binds]
        # The host's /usr brings its local configuration along: an empty read-only folder goes over it, and an
        # empty file over its pip.conf (host_config.HOST_FILES_UNDER_USR).
        hidden: dict[str, str] = {}
        if ("/usr", "/usr") in binds:
            hidden = {path: "ro,size=4k" for path in hidden_host_config()}
            volumes += [(empty_file(), path) for path in hidden_host_files()]
        env = {"PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "HOME": "/work"}
        env.update(runtime_env(spec))
        if problem.data_dir is not None:
            volumes.append((str(problem.data_dir), "/data"))
            env["EVOLVE_DATA_DIR"] = "/data"
        self.container = client.containers.create(
            spec.tag,
            [spec.python, "-u", "-I", "-B", "/opt/evolve/container_runner.py"],
            stdin_open=True,
            init=True,
            network_mode="none",
            read_only=True,
            tmpfs={
                "/work": work_mount(problem),
                "/tmp": f"size=256m,mode=1777,nr_inodes={SCRATCH_INODES['/tmp']}",
                "/dev/shm": f"size=64m,nr_inodes={SCRATCH_INODES['/dev/shm']}",
                **hidden,
            },
            mem_limit=f"{memory_cap_mb(limits.memory_mb)}m",
            memswap_limit=f"{memory_cap_mb(limits.memory_mb)}m",  # the same: no swap to spill into
            nano_cpus=1_000_000_000,
            pids_limit=limits.max_processes + 16,
            cap_drop=["ALL"],
            cap_add=["SETUID", "SETGID", "KILL", "DAC_OVERRIDE", "FOWNER", "CHOWN"],
            security_opt=["no-new-privileges"],
            ulimits=[Ulimit(name="core", soft=0, hard=0)],
            log_config=LogConfig(type="none"),
            # Mounts rather than `volumes`: Docker parses a volume as HOST:CONTAINER:MODE, so a host path holding
            # a colon (a problem folder "a:b", a checkout under it) was refused as an invalid specification.
            mounts=[Mount(inside, host, type="bind", read_only=True) for host, inside in volumes],
            environment=env,
            labels={"vpo-evolve.owner": OWNER, "vpo-evolve.pidns": PID_NAMESPACE},
        )
        self.spawn, self.uses, self._stray = spawn, 0, False
        self._buf, self._scanned = bytearray(), 0
        attach = None
        try:
            attach = self.container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self.container.start()
        except Exception:  # refused (a mount it could not make): removed, not left behind as a created container
            if attach is not None:
                with contextlib.suppress(Exception):
                    attach.close()
            _remove_quietly(self.container)
            raise
        self._attach, self._sock = attach, attach._sock

    def wait_ready(self) -> bool:
        """Read up to the runner's ready line: False (the container destroyed) when the channel closed first, or
        READY_WAIT_S passed. A line before it is no answer (no job was sent), but the channel carried something
        not the runner's: like a stray line while idle, it makes the first request UNEXPECTED."""
        deadline = time.monotonic() + READY_WAIT_S
        while (line := self._read_line(deadline)) != {"ready": True}:
            if line is None:
                self.destroy()
                return False
            self._stray = True
        return True

    def _read_line(self, deadline: float) -> Any:
        """The next JSON line on the container's stdout (stderr frames are dropped); None on EOF/deadline,
        UNEXPECTED for a line that is not JSON or longer than LINE_CAP (the runner's own answers never are).

        Frames are appended to one bytearray (amortised linear) and only the new frame is searched for the end
        of line, so a dense reply costs time linear in its size."""
        while True:
            end = self._buf.find(b"\n", self._scanned)
            if end >= 0:
                break
            self._scanned = len(self._buf)
            if len(self._buf) > LINE_CAP:
                return UNEXPECTED
            header = self._recv(8, deadline)
            if header is None:
                return None
            stream, size = header[0], struct.unpack(">I", header[4:])[0]
            payload = self._recv(size, deadline)
            if payload is None:
                return None
            if stream == 1:
                self._buf += payload
        line = bytes(self._buf[:end])
        del self._buf[: end + 1]
        self._scanned = 0
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            return UNEXPECTED

    def _recv(self, n: int, deadline: float) -> bytes | None:
        data = bytearray()
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(n - len(data))
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return bytes(data)

    def request(self, job: dict[str, Any], timeout_s: float) -> Any:
        """This job's answer; None when the container is silent or gone; UNEXPECTED when any other line came,
        or more than the answer did (the channel then cannot be trusted for later jobs either)."""
        self.uses += 1
        if self._stray:
            return UNEXPECTED
        nonce = secrets.token_hex(16)
        try:
            self._sock.sendall((json.dumps({**job, "spawn": self.spawn, "nonce": nonce}) + "\n").encode())
        except OSError:
            return None
        answer = self._read_line(time.monotonic() + timeout_s)
        if answer is None:
            return None
        if not isinstance(answer, dict) or answer.get("nonce") != nonce or self._buf:
            return UNEXPECTED
        return answer

    def interrupt(self) -> None:
        """Wake a `request()` waiting in another thread at once (it returns None; its caller destroys us)."""
        self._sock.shutdown(socket.SHUT_RDWR)

    def destroy(self) -> None:
        """Close the attach socket fully, then kill and remove the container without waiting long for it."""
        for close in (self._sock.close, self._attach.close):
            with contextlib.suppress(Exception):
                close()
        with contextlib.suppress(Exception):
            self.container.kill()
        # Removal can take the daemon many seconds; the worker must not wait for it (an engine that dies first
        # leaves an orphan that the next engine removes).
        removal = threading.Thread(target=_remove_quietly, args=(self.container,), daemon=True)
        _REMOVALS[:] = [*(t for t in _REMOVALS if t.is_alive()), removal]
        removal.start()


_REMOVALS: list[threading.Thread] = []  # removals started by destroy(); close() waits for them


def _remove_quietly(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.remove(force=True, v=True)


class DockerSandbox:
    kind = "docker"
    hides_files = True

    def __init__(
        self,
        workers: int = 2,
        *,
        spawn: bool = False,
        recycle_every: int = 500,
        base_image: str | None = None,
        image: ImageSpec | None = None,
    ) -> None:
        """`image`, when given, is used for every problem as it is (an image and binds resolved by the caller)."""
        import docker

        self.client = docker.from_env(timeout=60)
        self.spawn, self.recycle_every, self.base_image, self.image = spawn, recycle_every, base_image, image
        self._idle: queue.Queue[WarmContainer] = queue.Queue()
        self._spec: ImageSpec | None = None
        self._problem_root: Path | None = None
        self._running = RunningJobs()  # for abort_running(): the container of each job in flight
        self._remove_orphans()

    def _remove_orphans(self) -> None:
        """Containers left by an engine on this host that is no longer alive (e.g. after kill -9).

        Several sandboxes may start at once (Ray actors, other engines): one that finds an orphan already gone
        or being removed by another leaves it be. An engine in another pid namespace cannot be seen, so its
        containers are never taken for orphans (a container without the label predates it: this namespace's)."""
        import docker.errors

        host = socket.gethostname()
        for c in self.client.containers.list(all=True, filters={"label": "vpo-evolve.owner"}, ignore_removed=True):
            owner_host, _, pid = c.labels.get("vpo-evolve.owner", "").partition(":")
            here = owner_host == host and c.labels.get("vpo-evolve.pidns", PID_NAMESPACE) == PID_NAMESPACE
            if here and pid.isdigit() and not Path(f"/proc/{pid}").exists():
                with contextlib.suppress(docker.errors.APIError):  # NotFound, or 409: removal in progress
                    c.remove(force=True)

    @property
    def image_spec(self) -> ImageSpec | None:
        """The image (and binds) its containers run now: None before the first evaluation."""
        return self._spec

    def isolation(self) -> str:
        mode = "spawn mode" if self.spawn else "fork mode, from a zygote that never held a job"
        return (
            f"docker sandbox ({mode}): no network, read-only root, tmpfs scratch, unprivileged uid, "
            "address-space rlimit per process and a memory cgroup (no swap) over them all, pids/CPU limits, "
            "capabilities dropped, no-new-privileges, no logs kept, answers bound to a per-job nonce"
        )

    def _take(self, problem: Problem, ticket: int) -> WarmContainer:
        if self._problem_root != problem.root:
            self.close()
            self._spec = self.image or image_for(self.client, problem, self.base_image)
            self._problem_root = problem.root
        try:
            return self._idle.get_nowait()
        except queue.Empty:
            return self._fresh(problem, ticket)

    def _fresh(self, problem: Problem, ticket: int) -> WarmContainer:
        """A new container whose runner said it is ready, made a second time when the first failed: the daemon
        may refuse it (a host file it hides under /usr vanished between its listing and the mount: runc cannot
        make the mount point in the read-only /usr; the second start lists again), or its runner may end before
        it is ready. Neither is the candidate's fault. A runner slow to start (a loaded machine) is waited for,
        up to READY_WAIT_S, and Ctrl-C cuts the wait."""
        import docker.errors

        assert self._spec is not None
        why = ""
        for _ in range(2):
            try:
                box = WarmContainer(self.client, self._spec, problem, self.spawn)
            except docker.errors.APIError as exc:
                why = str(exc)
                continue
            with self._running.running(ticket, box.interrupt):
                if box.wait_ready():
                    return box
            why = f"the sandbox container did not start its runner (no ready line within {READY_WAIT_S:.0f} s)"
            if self._running.aborted(ticket):
                break
        raise RuntimeError(f"{why}; tried twice")

    def _start(self, problem: Problem, ticket: int, fresh: bool) -> WarmContainer | EvalOutcome:
        """A container for the job, or the outcome of a job aborted while its container was starting."""
        try:
            return self._fresh(problem, ticket) if fresh else self._take(problem, ticket)
        except Exception as exc:  # the host's fault, not the candidate's: the loop stops on a streak of these
            if self._running.aborted(ticket):
                return EvalOutcome.failure(problem, ErrorKind.CRASH, "aborted before it ran", 0.0, self.kind)
            raise SandboxRefused(f"docker sandbox: could not start a container: {exc}") from exc

    def abort_running(self) -> None:
        """Ctrl-C: cut every job's channel; its evaluate() then destroys the container and returns at once."""
        self._running.abort_all()

    def evaluate(self, problem: Problem, code: str) -> EvalOutcome:
        ticket = self._running.ticket()
        outcome = self._evaluate(problem, code, ticket)
        outcome.aborted = self._running.aborted(ticket)
        return outcome

    def _evaluate(self, problem: Problem, code: str, ticket: int) -> EvalOutcome:
        start = time.monotonic()
        try:
            files = program_files(problem, code)
        except TreeError as exc:
            return EvalOutcome.failure(problem, ErrorKind.INVALID, str(exc), 0.0, self.kind)
        box = self._start(problem, ticket, fresh=False)
        if isinstance(box, EvalOutcome):
            return box
        name = program_filename(problem)
        assert self._spec is not None
        tools = image_toolchain(self._spec, problem)
        job = make_job(problem, f"/work/{name}", "/work/_evolve_evaluator.py", "/work", tools)
        job["files"] = files
        if problem.form == "simple":
            job["files"]["_evolve_evaluator.py"] = problem.evaluator_path.read_text()
        limits = problem.config.sandbox_limits
        job["limits"] = {
            "timeout_s": limits.timeout_s,
            "memory_mb": limits.memory_mb,
            "max_file_mb": limits.max_file_mb,
        }
        with self._running.running(ticket, box.interrupt):
            answer = box.request(job, limits.timeout_s + GRACE_S)
        if answer is UNEXPECTED or _runner_failed(answer):
            # Someone other than the runner wrote on the channel, or the runner itself failed (e.g. an earlier
            # job left its scratch space full): neither is this candidate's doing, so run it once more in a
            # fresh container.
            box.destroy()
            box = self._start(problem, ticket, fresh=True)
            if isinstance(box, EvalOutcome):
                return box
            with self._running.running(ticket, box.interrupt):
                answer = box.request(job, limits.timeout_s + GRACE_S)
            if answer is UNEXPECTED:
                box.destroy()
                error = "the sandbox's channel carried lines that were not this job's answer, twice"
                return EvalOutcome.failure(problem, ErrorKind.BAD_OUTPUT, error, time.monotonic() - start, self.kind)
        duration = time.monotonic() - start
        if not isinstance(answer, dict) or "status" not in answer:
            box.destroy()
            kind = ErrorKind.TIMEOUT if duration >= limits.timeout_s + GRACE_S - 0.1 else ErrorKind.CRASH
            return EvalOutcome.failure(
                problem, kind, "the sandbox container stopped answering; it was replaced", duration, self.kind
            )
        aborted = self._running.aborted(ticket)  # its channel may have been cut as it answered: never reused
        if box.uses >= self.recycle_every or _runner_failed(answer) or answer.get("dirty") is True or aborted:
            box.destroy()
        else:
            self._idle.put(box)
        return outcome_from(
            problem,
            answer.get("reply"),
            str(answer["status"]),
            str(answer.get("stdout", "")),
            str(answer.get("stderr", "")),
            duration,
            self.kind,
            oom_cap_mb=memory_cap_mb(limits.memory_mb) if answer.get("oom_killed") is True else None,
        )

    def close(self) -> None:
        """Destroy the idle containers and wait (bounded) until every container removal has finished."""
        while True:
            try:
                self._idle.get_nowait().destroy()
            except queue.Empty:
                break
        deadline = time.monotonic() + 60
        while _REMOVALS:
            _REMOVALS.pop().join(timeout=max(0.0, deadline - time.monotonic()))
