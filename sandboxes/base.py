"""The seam between the engine and every isolation backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from evolve.fitness import failure_scores

if TYPE_CHECKING:
    from evolve.problem import Problem


class ErrorKind(StrEnum):
    TIMEOUT = "timeout"
    MEMORY = "memory"
    CRASH = "crash"
    BAD_OUTPUT = "bad_output"
    INVALID = "invalid"


OUTPUT_CAP = 64 * 1024
# What a candidate controls is stored and shown back: every text and collection in an outcome is bounded, so
# no reply, however large, costs the archive more than a few tens of KiB per evaluation.
ERROR_CAP = 2000
FEEDBACK_CAP = 8 * 1024
CASE_ERROR_CAP = 500
METRICS_CAP = 256  # named numbers kept; names cut to NAME_CAP characters
NAME_CAP = 100
STAGES_CAP = 16  # stages kept, each with at most METRICS_CAP numbers


class SandboxRefused(RuntimeError):
    """A namespace, limit or mount the sandbox promised could not be set up: nothing was run weaker instead."""


@dataclass
class EvalOutcome:
    """A scored program. `scores` always has every component (failures hold the component's fail value)."""

    scores: dict[str, float]
    error_kind: ErrorKind | None
    error: str | None
    duration_s: float
    sandbox: str
    stdout: str = ""
    stderr: str = ""
    feedback: str | None = None
    case_errors: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # simple form: every number evaluate() returned
    stages: list[dict[str, Any]] | None = None  # cascade: each stage's metrics, in order
    # True when `abort_running()` ended this evaluation: its scores say nothing about the program, so the loop
    # stores nothing for it and the child stays pending.
    aborted: bool = False

    def __post_init__(self) -> None:
        self.error = None if self.error is None else self.error[:ERROR_CAP]
        self.feedback = None if self.feedback is None else self.feedback[:FEEDBACK_CAP]
        self.case_errors = {k[:NAME_CAP]: v[:CASE_ERROR_CAP] for k, v in self.case_errors.items()}
        self.metrics = _named_numbers(self.metrics)
        if self.stages is not None:
            self.stages = [_stage(s) for s in self.stages[:STAGES_CAP]]

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @classmethod
    def failure(cls, problem: Problem, kind: ErrorKind, error: str, duration_s: float, sandbox: str) -> EvalOutcome:
        """A failed evaluation: every component at its fail value, the error cut to a storable length."""
        return cls(failure_scores(problem.components), kind, error[:2000], duration_s, sandbox)


def _named_numbers(values: dict[Any, Any]) -> dict[str, Any]:
    """At most METRICS_CAP entries with short names; values other than numbers and short strings are dropped."""
    kept: dict[str, Any] = {}
    for key, value in values.items():
        if len(kept) >= METRICS_CAP:
            break
        if isinstance(value, bool | int | float) or (isinstance(value, str) and len(value) <= NAME_CAP):
            kept[str(key)[:NAME_CAP]] = value
    return kept


def _stage(stage: Any) -> dict[str, Any]:
    """A cascade stage as the simple form reports it: {"stage": n, "metrics": {name: number}}."""
    if not isinstance(stage, dict):
        return {}
    number, metrics = stage.get("stage"), stage.get("metrics")
    return {
        "stage": number if isinstance(number, int) else None,
        "metrics": _named_numbers(metrics) if isinstance(metrics, dict) else {},
    }


@runtime_checkable
class Sandbox(Protocol):
    kind: str
    # False when candidates can read the host's files (the problem's evaluator, the archive, the home
    # directory): split-form problems then promise more than the sandbox keeps, and `evolve run` refuses them.
    hides_files: bool

    def isolation(self) -> str:
        """A short, honest sentence on what isolation is in force; says "WEAK" where files are not hidden."""
        ...

    def evaluate(self, problem: Problem, code: str) -> EvalOutcome: ...

    def close(self) -> None: ...


# ---- capabilities a sandbox may offer beyond `Sandbox`; the engine asks with isinstance, never getattr ------
@runtime_checkable
class AsyncSandbox(Protocol):
    """Evaluates without holding a thread (a cluster sandbox: the work runs elsewhere), so the loop awaits it
    directly and thousands of evaluations may be in flight at once."""

    async def aevaluate(self, problem: Problem, code: str) -> EvalOutcome: ...


@runtime_checkable
class AbortableSandbox(Protocol):
    """Can end its evaluations in flight at once (Ctrl-C): each running `evaluate()` returns promptly with an
    outcome marked `aborted`, and its processes or containers are gone."""

    def abort_running(self) -> None:
        """Kill every evaluation started before this call; quick and thread-safe (called from a signal handler
        on the event loop while worker threads evaluate). Later evaluations run as usual."""
        ...
