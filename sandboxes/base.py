"""The seam between the engine and every isolation backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol, runtime_checkable

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

    @property
    def ok(self) -> bool:
        return self.error_kind is None


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
