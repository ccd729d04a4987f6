"""The seam between the engine and every isolation backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from evolve.problem import Problem
    from evolve.problem.outcome import EvalOutcome


OUTPUT_CAP = 64 * 1024


class SandboxRefused(RuntimeError):
    """A namespace, limit or mount the sandbox promised could not be set up: nothing was run weaker instead."""


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
