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

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @classmethod
    def failure(cls, problem: Problem, kind: ErrorKind, error: str, duration_s: float, sandbox: str) -> EvalOutcome:
        """A failed evaluation: every component at its fail value, the error cut to a storable length."""
        return cls(failure_scores(problem.components), kind, error[:2000], duration_s, sandbox)


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
