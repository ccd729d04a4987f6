"""What the archive accepts and hands back across its boundary, as named records rather than dicts and tuples.

An evaluation used to arrive as a `dict[str, Any]` checked against the table's columns at run time; a typed
record makes a misspelt or missing field an error where the record is built, before any write is attempted.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, NamedTuple


@dataclass(frozen=True)
class EvaluationRecord:
    """One program's evaluation as stored: its raw scores and scalar view, how it failed, what it printed."""

    scores: dict[str, float]
    scalar: float | None
    error_kind: str | None
    error: str | None
    duration_s: float
    sandbox: str
    feedback: str | None = None
    stages: list[Any] | None = None  # cascade evaluators: each stage's metrics
    stdout: str | None = None
    stderr: str | None = None
    case_errors: dict[str, Any] | None = None  # case name → error, split form
    started_at: datetime | None = None  # when the sandbox got the program
    finished_at: datetime | None = None  # when its reply came back
    build_s: float | None = None  # a program of another language: its build's seconds, part of duration_s
    # What the candidate's code raised into the evaluator's, most frequent first: [{type, message, file, line, count}]
    swallowed: list[dict[str, Any]] | None = None
    # The seed's evaluation only: the first call of each function the fixed code calls, with real arguments
    first_calls: list[str] | None = None

    def columns(self) -> dict[str, Any]:
        """The record as the evaluations table's column values (every column, so that rows line up); shallow,
        since this is the committer's hot path."""
        return dict(vars(self))


class VariantRow(NamedTuple):
    """One parsed variant slot as stored with its group: its parse status, why, and the program it duplicates."""

    status: str
    detail: str | None
    program_id: int | None  # the existing program a duplicate repeats; None otherwise


@dataclass(frozen=True)
class PendingVariant:
    """A variant parsed as a new child whose evaluation never landed (the run was stopped or killed)."""

    variant_id: int
    slot: int
    parent_id: int
    completion_text: str
    island: int
    member: str | None = None  # the ensemble member and ask arm of its group (credited when it lands)
    ask: str | None = None


class StoredProgram(NamedTuple):
    """What became of one program given to the archive: its id, and whether this call created it (False: the
    same normalised code was stored already, and its variant is marked a duplicate)."""

    program_id: int
    created: bool


@dataclass(frozen=True)
class RunState:
    """What a run carries from one session to the next, stored as one JSON value in `runs.state`: time spent,
    groups since the last policy update, kills survived, why it last stopped, and the ensemble's record (its
    tallies by member and ask; `evolve.ensemble` reads and writes it). `of` reads any stored form, older ones
    included; `as_json` is what is stored."""

    elapsed_s: float = 0.0
    groups_since_train: int = 0
    interruptions: int = 0
    stop_reason: str | None = None
    adaptations: tuple[Any, ...] = ()
    ensemble: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # keys it does not name (older engines, other tools): kept

    @classmethod
    def of(cls, raw: Any) -> RunState:
        """The state of a stored JSON value. Every run is read through this, so a value it cannot use (a hand edit,
        another tool) is left at its default rather than making the run unreadable; other keys are kept as they are."""
        raw = raw if isinstance(raw, dict) else {}
        ensemble = raw.get("ensemble")
        named = {f.name for f in fields(cls)}
        stop, adaptations = raw.get("stop_reason"), raw.get("adaptations")
        return cls(
            extra={k: v for k, v in raw.items() if k not in named},
            elapsed_s=_number(raw.get("elapsed_s"), float),
            groups_since_train=_number(raw.get("groups_since_train"), int),
            interruptions=_number(raw.get("interruptions"), int),
            stop_reason=stop if isinstance(stop, str) else None,
            adaptations=tuple(adaptations) if isinstance(adaptations, list | tuple) else (),
            ensemble=dict(ensemble) if isinstance(ensemble, dict) else {},
        )

    def as_json(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"}
        return {**self.extra, **values, "adaptations": list(self.adaptations)}

    def updated(self, **changes: Any) -> RunState:
        return replace(self, **changes)


def _number(value: Any, kind: type) -> Any:
    """`value` as an int or float, 0 when absent or unreadable."""
    try:
        return kind(value or 0)
    except (TypeError, ValueError, OverflowError):
        return kind(0)


def _copied(cls: type[Any], row: Any, **given: Any) -> Any:
    """A record of `cls` from any object carrying its field names as attributes (inside the archive: an ORM row,
    read while its session is open); `given` supplies fields the object does not carry as such."""
    return cls(**{f.name: given[f.name] if f.name in given else getattr(row, f.name) for f in fields(cls)})


@dataclass(frozen=True)
class RunRecord:
    """A run as stored: what it is of, how it was started, how it stands (`state`, the typed record of its stored
    JSON value); `config` holds the problem's config and the run's options."""

    id: int
    problem_name: str
    problem_dir: str
    problem_fingerprint: str
    config: dict[str, Any]
    seed: int
    status: str
    state: RunState
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: Any) -> RunRecord:
        return _copied(cls, row, state=RunState.of(row.state))


@dataclass(frozen=True)
class PolicyVersionRecord:
    """One version of a member's policy: its number in the lineage, the adapter it serves (None: the base
    model), and the statistics of the update that made it."""

    id: int
    run_id: int | None
    number: int
    base_model: str
    member: str | None  # None in archives older than ensembles: the run's first member
    adapter_path: str | None
    parent_id: int | None
    train_config: dict[str, Any] | None
    stats: dict[str, Any] | None
    created_at: datetime

    @classmethod
    def of(cls, row: Any) -> PolicyVersionRecord:
        return _copied(cls, row)


@dataclass(frozen=True)
class StoredEvaluation:
    """An evaluation as the archive holds it: what was stored (see `EvaluationRecord`), its ids, when it was
    committed."""

    id: int
    program_id: int
    scores: dict[str, Any]
    scalar: float | None
    error_kind: str | None
    error: str | None
    duration_s: float
    sandbox: str
    feedback: str | None
    stages: list[Any] | None
    stdout: str | None
    stderr: str | None
    case_errors: dict[str, Any] | None
    started_at: datetime | None
    finished_at: datetime | None
    build_s: float | None
    swallowed: list[dict[str, Any]] | None
    first_calls: list[str] | None
    created_at: datetime

    @classmethod
    def of(cls, row: Any) -> StoredEvaluation:
        return _copied(cls, row)


@dataclass(frozen=True)
class ProgramRecord:
    """A program as stored, with its full text (the files of a program of several files joined,
    `evolve.filetree`) and its evaluation where one was read with it."""

    id: int
    run_id: int
    code: str
    code_hash: str
    parent_id: int | None
    island: int
    generation: int
    created_at: datetime
    evaluation: StoredEvaluation | None = None

    @classmethod
    def of(cls, row: Any, evaluation: StoredEvaluation | None = None) -> ProgramRecord:
        return _copied(cls, row, evaluation=evaluation)
