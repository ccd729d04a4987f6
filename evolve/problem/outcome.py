"""What one evaluation of a program came to: the type the sandboxes produce and the problem model consumes.

It lives beside the problem model, not in `sandboxes/`, so that the problem model (an OpenEvolve folder scores
its seed to learn its components) and every sandbox can import it without either climbing into the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from evolve.fitness import failure_scores

if TYPE_CHECKING:
    from evolve.problem.loader import Problem


class ErrorKind(StrEnum):
    TIMEOUT = "timeout"
    MEMORY = "memory"
    CRASH = "crash"
    BAD_OUTPUT = "bad_output"
    INVALID = "invalid"
    BUILD = "build"  # the program's [build] command failed or ran past its limits; the error holds its log
    SCORER = "scorer"  # the evaluator's trusted score() failed: past its deadline, or its process died


# What a candidate controls is stored and shown back: every text and collection in an outcome is bounded, so
# no reply, however large, costs the archive more than a few tens of KiB per evaluation.
ERROR_CAP = 2000
FEEDBACK_CAP = 8 * 1024
CASE_ERROR_CAP = 500
METRICS_CAP = 256  # named numbers kept; names cut to NAME_CAP characters
NAME_CAP = 100
STAGES_CAP = 16  # stages kept, each with at most METRICS_CAP numbers
SWALLOWED_CAP = 8  # distinct errors the candidate's code raised into the evaluator's, the most frequent
SWALLOWED_MESSAGE_CAP = 300
SWALLOWED_CODE_CAP = 120
FIRST_CALLS_CAP = 8  # the seed's first calls of the functions the fixed code calls (sandboxes/first_calls.py)
FIRST_CALL_CAP = 300  # characters of one such call as shown


@dataclass(frozen=True)
class SwallowedError:
    """An exception the candidate's own code raised into code that is not its own (the evaluator, the harness),
    whatever that code did with it: an evaluator that catches everything and scores 0 hid it from the model.
    `count` is how many times the same (type, message, file, line) escaped during the evaluation; `file` is the
    program file's path relative to its work folder (None: no frame of the program's was seen, as for a syntax
    error, whose own line is `line`)."""

    type: str
    message: str
    file: str | None
    line: int | None
    count: int
    code: str | None = None  # the text of that line, stripped (a prompt shows code without line numbers)

    def shown(self, name_file: bool = False) -> str:
        """One line as the prompt and `evolve show` print it: `NameError: name 'foo' is not defined (line 12,
        5 times) at `y = foo * x``; `name_file`: say which of the program's files (a program of several files)."""
        where = "" if self.line is None else f"line {self.line}"
        if name_file and self.file is not None:
            where = f"{self.file} {where}".strip()
        times = "once" if self.count == 1 else f"{self.count} times"
        head = f"{self.type}: {self.message}" if self.message else self.type
        return f"{head} ({where + ', ' if where else ''}{times})" + (f" at `{self.code}`" if self.code else "")

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "code": self.code,
            "count": self.count,
        }

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> SwallowedError:
        """From a stored or replied entry whose shape was checked (`sandboxes/reply_shape.py`); cut to its caps."""
        file, code = value.get("file"), value.get("code")
        return cls(
            str(value["type"])[:NAME_CAP],
            str(value["message"])[:SWALLOWED_MESSAGE_CAP],
            None if file is None else str(file)[: NAME_CAP * 2],
            value.get("line"),
            int(value["count"]),
            None if code is None else str(code)[:SWALLOWED_CODE_CAP],
        )


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
    # A program of another language: the seconds its [build] command took (part of `duration_s`); None for a
    # Python program, or when the evaluation never reached a build.
    build_s: float | None = None
    # What the candidate's code raised into the evaluator's or the harness's, the most frequent first (bounded).
    swallowed: list[SwallowedError] = field(default_factory=list)
    # The problem's seed only: the first call of each function of its editable code that its fixed code calls,
    # with the real arguments (`priority({'time': 11, ...})`), for prompts to show; [] for every other program.
    first_calls: list[str] = field(default_factory=list)
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
        self.swallowed = most_frequent(self.swallowed)
        self.first_calls = [c[:FIRST_CALL_CAP] for c in self.first_calls[:FIRST_CALLS_CAP]]

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @classmethod
    def failure(cls, problem: Problem, kind: ErrorKind, error: str, duration_s: float, sandbox: str) -> EvalOutcome:
        """A failed evaluation: every component at its fail value, the error cut to a storable length."""
        return cls(failure_scores(problem.components), kind, error[:2000], duration_s, sandbox)


def swallowed_lines(stored: Any, name_file: bool = True) -> list[str]:
    """Stored swallowed errors (the archive's JSON list) as one line each, as `evolve show` and the report print
    them; an entry of another shape (an archive edited by hand) is skipped, never raised on."""
    lines = []
    for entry in stored if isinstance(stored, list) else ():
        try:
            lines.append(SwallowedError.from_dict(entry).shown(name_file))
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    return lines


def most_frequent(entries: list[SwallowedError]) -> list[SwallowedError]:
    """At most SWALLOWED_CAP entries, the most frequent first, their texts cut."""
    ranked = sorted(entries, key=lambda e: -e.count)[:SWALLOWED_CAP]
    return [
        replace(
            e,
            type=e.type[:NAME_CAP],
            message=e.message[:SWALLOWED_MESSAGE_CAP],
            code=None if e.code is None else e.code[:SWALLOWED_CODE_CAP],
        )
        for e in ranked
    ]


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
