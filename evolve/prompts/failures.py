"""What a prompt shows of what went wrong: the parent's stderr tail, the cases it failed, the exceptions its code
raised into the evaluator's, and its newest failed children, each part bounded in size.

A failed child is one with an error kind (`crash`, `timeout`, `build`, ...) or, where the run lists them
(`zero_child_feedback`), one the evaluator refused: no error, yet the worst value on every component (its own
checks said no, or it swallowed the child's exception). Such a child's line carries the evaluator's feedback and the
exception its code raised most often, since without them the model reads only that the attempt scored nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from evolve.problem.outcome import SwallowedError
from evolve.yields import REFUSED

STDERR_TAIL = 600  # characters of the parent's stderr / traceback tail
CASE_ERRORS_SHOWN = 5
SWALLOWED_SHOWN = 5  # distinct errors the parent's code raised into the evaluator, the most frequent
CASE_ERROR_CAP = 160
FAILURE_LINES = 3  # first lines of each recent child failure
FAILURE_CAP = 300
BUILD_LINES, BUILD_CAP = 12, 900  # a failed build: its compiler's first errors, where the cause usually is


class FailureShown(Protocol):
    """A failed child as a prompt shows it (the archive's `ChildFailure` is one). Kind `refused`: the evaluator
    scored it the worst value on every component without an error; `error` is then its feedback, `swallowed` what
    its code raised into the evaluator (most frequent first) and `at_zero` whether those values were all 0."""

    @property
    def kind(self) -> str: ...

    @property
    def error(self) -> str: ...

    @property
    def swallowed(self) -> list[dict[str, Any]] | None: ...

    @property
    def at_zero(self) -> bool: ...


def first_lines(text: str, lines: int, cap: int) -> str:
    return "\n".join(text.strip().splitlines()[:lines])[:cap]


def failure_parts(
    stderr: str | None,
    case_errors: Mapping[str, str] | None,
    swallowed: Sequence[SwallowedError],
    recent: Sequence[FailureShown],
    multi_file: bool,
) -> list[str]:
    """The headings and bodies of what went wrong with the parent and its latest children (none when nothing
    did). `multi_file`: name the file of each exception (a program of several files)."""
    parts: list[str] = []
    if stderr and stderr.strip():
        parts += ["Its stderr (tail):", stderr.strip()[-STDERR_TAIL:]]
    if case_errors:
        items = list(case_errors.items())
        shown = [f"- {name}: {first_lines(err, 1, CASE_ERROR_CAP)}" for name, err in items[:CASE_ERRORS_SHOWN]]
        more = [f"- … and {len(items) - CASE_ERRORS_SHOWN} more failed cases"] if len(items) > CASE_ERRORS_SHOWN else []
        parts += ["Cases it failed:", "\n".join(shown + more)]
    if swallowed:
        lines = [f"- {error.shown(name_file=multi_file)}" for error in swallowed[:SWALLOWED_SHOWN]]
        parts += ["Exceptions its code raised while it was evaluated (most frequent first):", "\n".join(lines)]
    if recent:
        lines = [_failure_line(f, multi_file) for f in recent]
        parts += ["Recent attempts from this program that failed (avoid these mistakes):", "\n".join(lines)]
    return parts


def _failure_line(f: FailureShown, multi_file: bool) -> str:
    if f.kind == REFUSED:
        said = "scored 0" if f.at_zero else "scored the worst value"
        return f"- refused ({said} on every component): {_refused_text(f, multi_file)}"
    return f"- {f.kind}: {_failure_text(f.kind, f.error)}"


def _refused_text(f: FailureShown, multi_file: bool) -> str:
    """The evaluator's feedback's first lines, then the exception its code raised most often, if any: within the
    lines and characters of any other failure, the exception kept (it is the likelier cause to fix)."""
    raised = ""
    if f.swallowed:
        shown = SwallowedError.from_dict(f.swallowed[0]).shown(name_file=multi_file)
        raised = f"its code raised {shown}"[: FAILURE_CAP // 2]
    room = FAILURE_CAP - len(raised) - 1 if raised else FAILURE_CAP
    said = first_lines(f.error, FAILURE_LINES - 1 if raised else FAILURE_LINES, room)
    return "\n".join(part for part in (said, raised) if part) or "the evaluator said nothing more"


def _failure_text(kind: str, error: str) -> str:
    if kind == "build":
        return first_lines(error, BUILD_LINES, BUILD_CAP)
    return first_lines(error, FAILURE_LINES, FAILURE_CAP)
