"""The Docker sandbox: a warm pool of locked-down containers, one job at a time each.

The pool hands each evaluation an idle container of the problem's image (or starts one), sends it the job, and
puts it back when its answer was clean. The engine keeps its own deadline on every request; a container that
misses it, dies, or answers garbage is destroyed and replaced, and the evaluation gets an error kind. What a
container may do is docker_lockdown.py; one container's life and channel, warm_container.py.

Each container has its own pid namespace: the job killer's kill(-1) in it reaches no host process and no other
container, whatever their uid. An engine removes its own containers and those of engines it sees are dead.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from pathlib import Path

from evolve.filetree import TreeError
from evolve.problem import Problem
from evolve.problem.outcome import ErrorKind, EvalOutcome
from sandboxes.abort import RunningJobs
from sandboxes.attach_channel import UNEXPECTED
from sandboxes.cpu_share import InFlight
from sandboxes.docker_images import ImageSpec, image_for, image_toolchain, memory_cap_mb
from sandboxes.docker_lockdown import OWNER, PID_NAMESPACE, container_settings
from sandboxes.sandbox import SandboxRefused
from sandboxes.scoring import make_job, outcome_from, program_filename, program_files
from sandboxes.warm_container import READY_WAIT_S, WarmContainer, wait_for_removals

__all__ = ["OWNER", "DockerSandbox", "docker_available"]

GRACE_S = 5.0


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
        self._switching = threading.Lock()  # both slots may meet a new problem at once: one image, built once
        self._running = RunningJobs()  # for abort_running(): the container of each job in flight
        self.evaluations_in_flight = InFlight()  # CountsEvaluations: a decoding policy leaves each a core
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
        with self._switching:
            if self._problem_root != problem.root:
                self.close()
                self._spec = self.image or image_for(self.client, problem, self.base_image)
                self._problem_root = problem.root
        while True:
            try:
                box = self._idle.get_nowait()
            except queue.Empty:
                return self._fresh(problem, ticket)
            if box.made_for == problem.root:
                return box
            box.destroy()  # put back by a job of the problem before a switch: its image and binds are that one's

    def _fresh(self, problem: Problem, ticket: int) -> WarmContainer:
        """A new container whose runner said it is ready, made a second time when the first failed: the daemon
        may refuse it (a host file it hides under /usr vanished between its listing and the mount: runc cannot
        make the mount point in the read-only /usr; the second start lists again), or its runner may end before
        it is ready. Neither is the candidate's fault. A runner slow to start (a loaded machine) is waited for,
        up to READY_WAIT_S, and Ctrl-C cuts the wait."""
        import docker.errors

        spec = self._spec
        assert spec is not None
        why = ""
        for _ in range(2):
            try:
                box = WarmContainer(self.client, container_settings(spec, problem), self.spawn)
            except docker.errors.APIError as exc:
                why = str(exc)
                continue
            box.made_for = problem.root
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
        job = make_job(problem, f"/work/{name}", "/work/_evolve_evaluator.py", "/work", tools, code=code)
        job["files"] = files
        if problem.form == "simple":
            job["files"]["_evolve_evaluator.py"] = problem.evaluator_path.read_text()
        limits = problem.config.sandbox_limits
        job["limits"] = {
            "timeout_s": limits.timeout_s,
            "memory_mb": limits.memory_mb,
            "max_file_mb": limits.max_file_mb,
        }
        with self._running.running(ticket, box.interrupt), self.evaluations_in_flight.running():
            answer = box.request(job, limits.timeout_s + GRACE_S)
        if answer is UNEXPECTED or _runner_failed(answer):
            # Someone other than the runner wrote on the channel, or the runner itself failed (e.g. an earlier
            # job left its scratch space full): neither is this candidate's doing, so run it once more in a
            # fresh container.
            box.destroy()
            box = self._start(problem, ticket, fresh=True)
            if isinstance(box, EvalOutcome):
                return box
            with self._running.running(ticket, box.interrupt), self.evaluations_in_flight.running():
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
        wait_for_removals(60)
