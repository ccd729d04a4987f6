"""Evaluations on a Ray cluster: actors on any node, each holding that node's own local sandbox.

The engine keeps its single committer: this sandbox only returns outcomes, like every other. Each actor owns
`slots_per_actor` evaluation slots (a threaded actor); the engine's `--workers` bounds how many evaluations
are in flight over all of them. When an actor or its node dies mid-evaluation the job is sent to another
live actor, and a replacement actor is started in the background (Ray places it on a node with room), so a
lost node costs time but never an evaluation, and the engine still receives exactly one outcome per child.

The problem folder travels with the jobs (packed once, kept in Ray's object store), so worker nodes need
vpo-evolve installed but not a copy of the problem. An actor unpacks it into its user's private folder (for root,
/run/vpo-evolve-ray-problems, root's 0700: sandboxes/private_dirs.py), never into a shared one: loading a problem
runs its evaluator, and a folder that another local user could make first under the expected name had root's
actor run her evaluator as root, and showed every user the hidden answers (issue #57, second round, finding 19).
So candidates read its data/ only through their sandbox's own mount (bubblewrap, Docker); a WEAK process sandbox
of root's, whose candidates run as slot uids on the host's files, cannot reach an unpacked problem.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import stat
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.problem import Problem, ProblemError, load_problem
from evolve.problem.outcome import ErrorKind, EvalOutcome
from sandboxes.private_dirs import private_folder
from sandboxes.sandbox import Sandbox

UNPACK_FOLDER = "vpo-evolve-ray-problems"  # the name of the private folder problems are unpacked in
NO_ACTOR_WAIT_S = 600.0  # how long a job waits for any live actor before it is scored as a crash
MAX_ATTEMPTS = 8
POLL_S = 0.5  # how often a job with no live actor looks again


class RayUnavailable(Exception):
    """Ray is not installed or no cluster answers; `str()` says what to do."""


def pack_folder(root: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(root, arcname=".")
    return buf.getvalue()


def _only_ours(folder: Path) -> Path | None:
    """`folder` (the engine's problem path, which this node may lack) resolved, where no other user can have made
    or changed it: it and everything in it ours or root's and writable by no one else, and its parents too, or
    sticky (/tmp); else None. Loading a problem runs its evaluator, so a folder another user made at that path
    must never be loaded."""
    me = {0, os.geteuid()}
    try:
        real = folder.resolve(strict=True)
        for parent in real.parents:
            info = os.stat(parent)
            if info.st_uid not in me or (info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX):
                return None
        for where, folders, files in os.walk(real):
            for name in [".", *folders, *files]:
                info = os.lstat(os.path.join(where, name))
                if info.st_uid not in me or (info.st_mode & 0o022 and not stat.S_ISLNK(info.st_mode)):
                    return None
    except OSError:
        return None
    return real


def _unpacked(fingerprint: str, bundle: list[Any]) -> Problem:
    """The problem of `fingerprint`, from its folder in this user's private unpack folder, unpacked there first
    from `bundle` unless an earlier actor of this user did so; a folder found there that holds another problem (a
    half-made or edited one) is unpacked again."""
    import ray

    root = private_folder(UNPACK_FOLDER, "--sandbox ray")
    target = root / fingerprint
    if target.is_dir():
        with contextlib.suppress(ProblemError):
            problem = load_problem(target)
            if problem.fingerprint() == fingerprint:
                return problem
        shutil.rmtree(target)
    staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{fingerprint}."))  # 0700; named unpredictably
    try:
        with tarfile.open(fileobj=io.BytesIO(ray.get(bundle[0])), mode="r:gz") as tar:
            tar.extractall(staging, filter="data")
        os.chmod(staging, 0o700)  # the archive's "." entry carries the problem folder's own mode
        try:
            os.replace(staging, target)
        except OSError:  # another actor of this user put it there first
            shutil.rmtree(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    problem = load_problem(target)
    if problem.fingerprint() != fingerprint:
        raise RuntimeError(f"--sandbox ray: the problem unpacked in {target} is not the one sent ({fingerprint})")
    return problem


def _local_sandbox(kind: str, slots: int) -> Sandbox:
    from sandboxes.backends import make_sandbox

    return make_sandbox(kind, workers=slots)


class Evaluator:
    """The actor body: one local sandbox on its node, and the problems it has been sent, loaded once each."""

    def __init__(self, make_local: Callable[[], Sandbox]) -> None:
        self.sandbox = make_local()
        self.problems: dict[str, Problem] = {}
        self.lock = threading.Lock()

    def ready(self) -> str:
        import ray

        return f"{ray.get_runtime_context().get_node_id()}:{os.getpid()} {self.sandbox.isolation()}"

    def _problem(self, fingerprint: str, root: str, bundle: list[Any]) -> Problem:
        with self.lock:
            if fingerprint in self.problems:
                return self.problems[fingerprint]
            here = _only_ours(Path(root))
            problem = load_problem(here) if here is not None and (here / "problem.toml").is_file() else None
            if problem is None or problem.fingerprint() != fingerprint:
                problem = _unpacked(fingerprint, bundle)
            self.problems[fingerprint] = problem
            return problem

    def evaluate(self, fingerprint: str, root: str, bundle: list[Any], code: str) -> EvalOutcome:
        return self.sandbox.evaluate(self._problem(fingerprint, root, bundle), code)


@dataclass
class _Slot:
    handle: Any
    generation: int
    in_flight: int = 0
    live: bool = True


class RaySandbox:
    kind = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        slots: int = 4,
        slots_per_actor: int = 1,
        cpus_per_actor: float | None = None,
        local: str = "auto",
        make_local: Callable[[], Sandbox] | None = None,
    ) -> None:
        try:
            import ray
        except ImportError:
            raise RayUnavailable("--sandbox ray: Ray is not installed; pip install 'vpo-evolve[ray]'") from None
        self._ray = ray
        self._owns_ray = not ray.is_initialized()
        try:
            if self._owns_ray:
                # only a new cluster takes these; a local one listens on loopback alone
                new_cluster = {} if address else {"include_dashboard": False, "_node_ip_address": "127.0.0.1"}
                ray.init(address=address or None, namespace="vpo-evolve", log_to_driver=False, **new_cluster)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = address or "a new local cluster"
            raise RayUnavailable(
                f"--sandbox ray{':' + address if address else ''}: cannot join {where} ({exc}); "
                "start the head with `ray start --head` or check the address"
            ) from None
        per_actor = max(1, slots_per_actor)
        count = max(1, -(-slots // per_actor))
        cpus = float(per_actor) if cpus_per_actor is None else cpus_per_actor
        factory = make_local or (lambda: _local_sandbox(local, per_actor))
        self._actor_class = ray.remote(Evaluator).options(
            num_cpus=cpus, max_concurrency=per_actor, max_restarts=0, scheduling_strategy="SPREAD"
        )
        self._factory = factory
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._replacers: list[threading.Thread] = []  # background starts of actors that replace lost ones
        self._bundles: dict[str, list[Any]] = {}
        self._slots = [_Slot(self._actor_class.remote(factory), 0) for _ in range(count)]
        self.nodes: set[str] = set()
        try:
            wheres = ray.get([s.handle.ready.remote() for s in self._slots], timeout=120)
            for where in wheres:
                self.nodes.add(where.split(":")[0])
                self._isolation = where.split(" ", 1)[1]
            # hidden only if every node's sandbox hides the host's files (a WEAK one says so in its isolation)
            self.hides_files = all("WEAK" not in where for where in wheres)
        except Exception as exc:
            self.close()
            raise RayUnavailable(f"--sandbox ray: the evaluator actors did not start ({exc})") from None
        self.replacements = 0

    def isolation(self) -> str:
        return f"Ray actors ({len(self._slots)}) on {len(self.nodes)} node(s), each with: {self._isolation}"

    # ---- slot bookkeeping (shared by the sync and async paths) -------------------------------------------
    def _bundle(self, problem: Problem) -> tuple[str, list[Any]]:
        fingerprint = problem.fingerprint()
        with self._lock:
            if fingerprint not in self._bundles:
                self._bundles[fingerprint] = [self._ray.put(pack_folder(problem.root))]
            return fingerprint, self._bundles[fingerprint]

    def _take(self) -> tuple[int, _Slot] | None:
        with self._lock:
            live = [(i, s) for i, s in enumerate(self._slots) if s.live]
            if not live:
                return None
            index, slot = min(live, key=lambda pair: pair[1].in_flight)
            slot.in_flight += 1
            return index, slot

    def _give_back(self, slot: _Slot) -> None:
        with self._lock:
            slot.in_flight -= 1

    def _lost(self, index: int, slot: _Slot) -> None:
        """An actor died: stop using it and start its replacement in the background, once per generation."""
        with self._lock:
            if self._slots[index] is not slot or not slot.live:
                return
            slot.live = False
            generation = slot.generation + 1
        with contextlib.suppress(Exception):  # merely unreachable (not dead) actors must not linger
            self._ray.kill(slot.handle)
        replacer = threading.Thread(target=self._replace, args=(index, generation), daemon=True)
        self._replacers.append(replacer)
        replacer.start()

    def _replace(self, index: int, generation: int) -> None:
        """Start a new actor for slot `index` until one answers; gives up when the sandbox closes, so that no
        thread touches Ray after `close()` shut it down (Ray ends the whole process when one does)."""
        while not self._closed.is_set():
            handle = None
            try:
                handle = self._actor_class.remote(self._factory)
                ready = handle.ready.remote()
                deadline = time.monotonic() + NO_ACTOR_WAIT_S
                while not self._ray.wait([ready], timeout=POLL_S)[0]:
                    if self._closed.is_set() or time.monotonic() > deadline:
                        raise TimeoutError("the replacement actor did not start")
                self._ray.get(ready)
            except Exception:
                if handle is not None:
                    with contextlib.suppress(Exception):
                        self._ray.kill(handle)
                self._closed.wait(1.0)
                continue
            with self._lock:
                if not self._closed.is_set():
                    self._slots[index] = _Slot(handle, generation)
                    self.replacements += 1
                    return
            with contextlib.suppress(Exception):  # closed while it started: close() no longer sees it
                self._ray.kill(handle)
            return

    def _is_lost_actor(self, exc: BaseException) -> bool:
        errors = self._ray.exceptions
        lost = (errors.RayActorError, errors.WorkerCrashedError, errors.NodeDiedError, errors.ObjectLostError)
        return isinstance(exc, lost)

    def _crash(self, problem: Problem, message: str) -> EvalOutcome:
        from sandboxes.runner import failed

        return failed(problem, ErrorKind.CRASH, message, 0.0, self.kind)

    # ---- evaluation -------------------------------------------------------------------------------------
    def _attempts(self, problem: Problem, code: str) -> Generator[Any, Any, EvalOutcome]:
        """The retry loop, written once for both paths: it yields `POLL_S` to wait for a live actor, or a Ray
        object ref to be resolved (the result, or the exception its resolution raised, is sent back in); a
        lost actor's job goes to another one. `evaluate` and `aevaluate` only carry out the waits."""
        fingerprint, bundle = self._bundle(problem)
        waited = 0.0
        for _ in range(MAX_ATTEMPTS):
            taken = self._take()
            while taken is None:
                if waited > NO_ACTOR_WAIT_S:
                    return self._crash(problem, f"no live Ray evaluator for {NO_ACTOR_WAIT_S:.0f} s")
                yield POLL_S
                waited += POLL_S
                taken = self._take()
            index, slot = taken
            try:
                return (yield slot.handle.evaluate.remote(fingerprint, str(problem.root), bundle, code))
            except Exception as exc:
                if not self._is_lost_actor(exc):
                    raise
                self._lost(index, slot)
            finally:
                self._give_back(slot)
        return self._crash(problem, f"the evaluation's Ray actor died {MAX_ATTEMPTS} times")

    async def aevaluate(self, problem: Problem, code: str) -> EvalOutcome:
        """Evaluate on a live actor without holding a thread (the engine awaits this: `AsyncSandbox`)."""
        steps = self._attempts(problem, code)
        try:
            step = next(steps)
            while True:
                if isinstance(step, float):
                    await asyncio.sleep(step)
                    step = steps.send(None)
                    continue
                try:
                    result = await step
                except Exception as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            steps.close()  # cancelled mid-wait: the slot is given back now, not when the generator is collected

    def evaluate(self, problem: Problem, code: str) -> EvalOutcome:
        """The same, blocking this thread (the Ray overhead benchmark, or a caller without an event loop)."""
        steps = self._attempts(problem, code)
        try:
            step = next(steps)
            while True:
                if isinstance(step, float):
                    time.sleep(step)
                    step = steps.send(None)
                    continue
                try:
                    result = self._ray.get(step)
                except Exception as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(result)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            steps.close()  # interrupted mid-wait: the slot is given back now, not when the generator is collected

    def close(self) -> None:
        closed = getattr(self, "_closed", None)
        if closed is not None:
            closed.set()
            for replacer in self._replacers:  # each notices within POLL_S; Ray must outlive them
                replacer.join(timeout=30)
        for slot in getattr(self, "_slots", []):
            with contextlib.suppress(Exception):  # already gone with its node
                self._ray.kill(slot.handle)
        if getattr(self, "_owns_ray", False):
            self._ray.shutdown()
