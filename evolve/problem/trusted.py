"""The split form's trusted `cases()` and `score()`, each with a deadline, in processes the engine can kill.

They are the problem author's code, and `score()` is fed what a candidate answered: one that never returned hung
the engine's evaluation thread for good (no thread can be killed), the run with it, and Ctrl-C, since Python
waits for its worker threads before it exits. Here they run in child processes (evolve/problem/scorer_process.py):
`cases()` gets `CASES_TIMEOUT_S` at load, each `score()` call the problem's `[limits] timeout_s`; a call past its
deadline kills its process, that case is the evaluator's failure (`Scored.scorer_error`), and the next case goes
to a fresh process. `abort()` (Ctrl-C) kills the processes in use, so their callers return at once.

One process serves one caller at a time; the pool grows to as many as evaluate at once (`--workers`) and keeps
them between calls, so a call costs one pipe round trip per evaluation (a batch of its cases), not a start.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import math
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from evolve.problem.scorer_process import FRAME

SCRIPT = Path(__file__).with_name("scorer_process.py")
# Names of the engine's environment that carry credentials (OPENAI_API_KEY, HF_TOKEN, AWS_SECRET_ACCESS_KEY,
# PGPASSWORD, ...): kept from the evaluator, whose folder may come from elsewhere (see `scorer_environment`).
CREDENTIAL_NAME = re.compile(r"KEY|TOKEN|SECRET|PASS(WORD|WD)?|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)


def scorer_environment() -> dict[str, str]:
    """The engine's environment less every variable whose name says it holds a credential.

    Why: `cases()` and `score()` are the problem folder's code, run on the host as the engine's user (they read
    the hidden answers, so no jail hides the user's files from them: a problem folder is code you run). A folder
    from elsewhere still gets no API key it could send on, as a server it names gets none without
    `--trust-problem-urls` (policies/http_policy.py); PATH, HOME, locale and the like stay."""
    return {name: value for name, value in os.environ.items() if not CREDENTIAL_NAME.search(name)}


CASES_TIMEOUT_S = 60.0  # importing the evaluator and cases() at load, and a fresh process's import
_LIVE: set[int] = set()  # pids of every scorer process alive, whatever pool it belongs to


def scorer_pids() -> frozenset[int]:
    """The engine's scorer processes: its own long-lived children, which no sweep of a job's leftovers may take."""
    return frozenset(_LIVE)


class ScorerError(Exception):
    """The evaluator could not be imported, or its `cases()` raised, returned unpicklable data or hung."""


@dataclass(frozen=True)
class Scored:
    """One case's score: `value` None when there is none (the case then takes its fail value; `note` says why).
    `scorer_error` is set when the evaluator itself failed: past its deadline, its process died, Ctrl-C."""

    value: float | None
    note: str | None
    scorer_error: str | None = None
    aborted: bool = False  # Ctrl-C stopped it: the case says nothing of the program


def module_name(evaluator: Path) -> str:
    """The name the evaluator is imported under, the same in every process, so that pickles name its objects."""
    return f"_evolve_evaluator_{hashlib.sha1(str(evaluator).encode()).hexdigest()[:10]}"


def import_evaluator(evaluator: Path) -> ModuleType:
    """The evaluator imported into the engine, only where a pickled case names one of its classes or functions."""
    name = module_name(evaluator)
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, evaluator)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(evaluator.parent))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(str(evaluator.parent))
    return module


class _CaseUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, evaluator: Path) -> None:
        import io

        super().__init__(io.BytesIO(data))
        self.evaluator = evaluator

    def find_class(self, module: str, name: str) -> Any:
        if module == module_name(self.evaluator):
            import_evaluator(self.evaluator)
        return super().find_class(module, name)


class _Died(Exception):
    """The process ended, or stopped answering in time (`timed_out`)."""

    def __init__(self, timed_out: bool = False) -> None:
        self.timed_out = timed_out


class ScorerProcess:
    """One child process holding the evaluator; it answers frames in order on its pipes."""

    def __init__(self) -> None:
        # The engine's interpreter and environment; -P keeps this script's folder off sys.path (the engine's own
        # sys.path is sent next), -B where the engine writes no bytecode (nothing new in the problem folder).
        flags = ["-P", *(["-B"] if sys.dont_write_bytecode else [])]
        self.proc = subprocess.Popen(
            [sys.executable, *flags, str(SCRIPT), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,  # the terminal's Ctrl-C is the engine's; the group is killed as one
            env=scorer_environment(),
        )
        _LIVE.add(self.proc.pid)
        self.aborted = False
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        self._ahead = bytearray()  # read from the pipe, not yet taken

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        data = FRAME.pack(len(data)) + data
        try:
            while data:
                data = data[os.write(self._in, data) :]
        except OSError:
            raise _Died() from None

    def receive(self, timeout_s: float) -> Any:
        """The next frame within `timeout_s` (the whole frame), else `_Died`."""
        deadline = time.monotonic() + timeout_s
        head = self._read(FRAME.size, deadline)
        return pickle.loads(self._read(FRAME.unpack(head)[0], deadline))

    def _read(self, size: int, deadline: float) -> bytes:
        """`size` bytes, from what was read ahead first: the answers of a batch arrive together, one read for all."""
        while len(self._ahead) < size:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._out], [], [], left)[0]:
                raise _Died(timed_out=True)
            chunk = os.read(self._out, max(size - len(self._ahead), 1 << 16))
            if not chunk:
                raise _Died()
            self._ahead += chunk
        data = bytes(self._ahead[:size])
        del self._ahead[:size]
        return data

    def kill(self) -> None:
        if self.proc.returncode is not None:
            return  # reaped already: its pid may belong to another process by now
        with contextlib.suppress(OSError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # score() may have started processes of its own

    def close(self) -> None:
        """Kill it, reap it and close its pipes."""
        self.kill()
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            self.proc.wait(timeout=5)
        for pipe in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                pipe.close()  # type: ignore[union-attr]
        _LIVE.discard(self.proc.pid)

    def ended(self) -> str:
        """How it ended, for a message: "exit 1", "signal SIGKILL"."""
        with contextlib.suppress(subprocess.SubprocessError):
            self.proc.wait(timeout=1)
        code = self.proc.returncode
        if code is None:
            return "no answer"
        return f"exit {code}" if code >= 0 else f"signal {signal.Signals(-code).name}"


def _close_all(processes: list[ScorerProcess]) -> None:
    for process in list(processes):
        process.close()


class TrustedScorer:
    """The evaluator's `cases()` and `score()` behind deadlines: a pool of scorer processes for one problem."""

    def __init__(self, evaluator: Path, score_timeout_s: float) -> None:
        self.evaluator, self.score_timeout_s = evaluator, score_timeout_s
        self._cases: bytes | None = None  # the case dicts every new process is given (pickled once)
        self._lock = threading.Lock()
        self._idle: list[ScorerProcess] = []
        self._busy: list[ScorerProcess] = []
        self._all: list[ScorerProcess] = []
        self._finalizer = weakref.finalize(self, _close_all, self._all)

    def _init(self) -> dict[str, Any]:
        return {
            "path": str(self.evaluator),
            "module": module_name(self.evaluator),
            "sys_path": list(sys.path),
            "cases": self._cases,
        }

    def load_cases(self) -> Any:
        """What `cases()` returned, run in the pool's first process within `CASES_TIMEOUT_S`; raises ScorerError
        with one line (why, and the fix) otherwise. Call `use_cases` with the validated list next."""
        process = self._spawn()
        try:
            verb, body = process.receive(CASES_TIMEOUT_S)
        except _Died as died:
            process.close()
            if died.timed_out:
                raise ScorerError(
                    f"cases() did not return within {CASES_TIMEOUT_S:g} s (importing the evaluator included)"
                ) from None
            raise ScorerError(f"the evaluator's process ended ({process.ended()}) before cases() returned") from None
        if verb == "error":
            process.close()
            raise ScorerError(body)
        try:
            raw = _CaseUnpickler(body, self.evaluator).load()
        except Exception as exc:
            process.close()
            why = f"{type(exc).__name__}: {exc}"
            raise ScorerError(f"cases() returned what the engine cannot read back ({why})") from None
        self._give_back(process)
        return raw

    def use_cases(self, cases: list[dict[str, Any]]) -> None:
        """The case dicts (name, input and the trusted rest) that `score(case, output)` is given, by index."""
        self._cases = pickle.dumps(cases, protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            idle = list(self._idle)
        for process in idle:
            try:
                process.send(("cases", self._cases))
            except _Died:
                self._discard(process)

    def score(self, items: list[tuple[int, Any]]) -> list[Scored]:
        """Score (case index, output) pairs, one `Scored` each, in order. Never raises, never waits past a
        deadline per case: a case past it, or whose process died twice, is the evaluator's failure."""
        results: list[Scored] = []
        retried = False  # one unexpected death is forgiven (a process killed from outside); two are score()'s
        while len(results) < len(items):
            try:
                process = self._take()
            except ScorerError as exc:
                error = f"the evaluator's process could not start again: {exc}"
                return results + [Scored(None, error, error)] * (len(items) - len(results))
            try:
                process.send(("score", items[len(results) :]))
                while len(results) < len(items):
                    results.append(_scored(process.receive(self.score_timeout_s)))
            except _Died as died:
                self._discard(process)
                if process.aborted:
                    error = "scoring was stopped (Ctrl-C)"
                    return results + [Scored(None, error, error, aborted=True)] * (len(items) - len(results))
                if died.timed_out:
                    error = f"score() ran past its deadline of {self.score_timeout_s:g} s ([limits] timeout_s)"
                elif retried:
                    error = f"the evaluator's process ended while score() ran ({process.ended()})"
                else:
                    retried = True
                    continue
                results.append(Scored(None, error, error))
                continue
            self._give_back(process)
        return results

    def abort(self) -> None:
        """Kill the processes in use (Ctrl-C): their callers return at once, their cases marked stopped."""
        with self._lock:
            busy = list(self._busy)
        for process in busy:
            process.aborted = True
            process.kill()

    def close(self) -> None:
        self._finalizer()

    # ---- the pool ---------------------------------------------------------------------------------------
    def _spawn(self) -> ScorerProcess:
        """A new process, given its start (`_init`); in use until given back."""
        try:
            process = ScorerProcess()
        except OSError as exc:
            raise ScorerError(f"the evaluator's process could not start: {exc}") from None
        with self._lock:
            self._all.append(process)
            self._busy.append(process)
        try:
            process.send(self._init())
        except _Died:
            self._discard(process)
            raise ScorerError(f"the evaluator's process ended at once ({process.ended()})") from None
        return process

    def _take(self) -> ScorerProcess:
        """An idle process (one that died meanwhile is dropped), else a new one, ready within its deadline."""
        while True:
            with self._lock:
                process = self._idle.pop() if self._idle else None
                if process is not None:
                    self._busy.append(process)
            if process is None:
                break
            if process.alive():
                return process
            self._discard(process)
        process = self._spawn()
        try:
            verb, body = process.receive(CASES_TIMEOUT_S)
        except _Died as died:
            self._discard(process)
            raise ScorerError("it timed out" if died.timed_out else process.ended()) from None
        if verb != "ready":
            self._discard(process)
            raise ScorerError(str(body))
        return process

    def _give_back(self, process: ScorerProcess) -> None:
        with self._lock:
            self._busy.remove(process)
            self._idle.append(process)

    def _discard(self, process: ScorerProcess) -> None:
        process.close()
        with self._lock:
            for pool in (self._busy, self._idle, self._all):
                with contextlib.suppress(ValueError):
                    pool.remove(process)


def _scored(answer: Any) -> Scored:
    """A scorer process's answer as a score or the reason there is none (the messages `score_case` always gave)."""
    if answer[0] == "raised":
        _, kind, where, message = answer
        return Scored(None, f"score() raised {kind}{where}: {message}"[:500])
    _, value, kind, feedback = answer
    if value is None:
        return Scored(None, f"score() returned {kind}, not a number")
    if not math.isfinite(value):
        return Scored(None, f"score() returned {value}")
    return Scored(value, feedback)
