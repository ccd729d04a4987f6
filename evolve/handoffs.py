"""The hand-offs of the engine: every record that passes from one part of the loop to another, in the order a
child meets them (docs/architecture.md, "One child through the engine").

A group's completions are parsed into `HashedVariant`s; the ledger admits them (`Admitted`: each variant's row,
its new ones as `NewVariant`s); the store makes each new one a `Child` (with its variant row) in a `GroupResult`;
the evaluation stage scores a `Child` into an `EvaluationResult`; the commit stage stores it and says what became
of it (`StoredChild`), which the ledger applies. A session starts from a `ScoredRun`. Each hand-over is one of
these records, so that a reader of any part sees what it receives without following tuples back to where they
were packed.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from evolve.archive import GroupOutcome, ScoredProgram
from evolve.archive.records import VariantRow
from evolve.problem.outcome import EvalOutcome
from evolve.prompts import ParsedVariant
from evolve.selection import RankedProgram


@dataclass(frozen=True)
class Child:
    """A new program parsed out of one variant slot, waiting for (or under) evaluation."""

    code: str
    parent_id: int | None
    island: int
    generation: int
    variant_id: int | None
    digest: str  # its normalised-code hash, computed once when it was parsed
    member: str = ""  # the ensemble member and ask arm whose group wrote it (credited when it lands)
    ask: str = ""
    parent_scalar: float | None = None  # what it must beat to count as an improvement


@dataclass(frozen=True)
class HashedVariant:
    """One variant as parsed, with its code's normalised hash (None when it parsed into no code): what the ledger
    reads to tell a new child from a copy."""

    variant: ParsedVariant
    digest: str | None


@dataclass(frozen=True)
class ScoredRun:
    """What a session starts from: the run's scored programs, its code index (normalised hash → program id) and
    its groups in order (which parent each asked for, and whether it made a new program)."""

    programs: list[ScoredProgram]
    code_index: dict[str, int]
    groups: list[GroupOutcome] = field(default_factory=list)


@dataclass(frozen=True)
class GroupCost:
    """What sampling one group cost: completions, tokens (counted, or estimated from the text) and seconds."""

    completions: int = 0
    tokens: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class NewVariant:
    """A variant that parsed into code not seen before: the child it becomes once its group is stored."""

    completion: int  # index of its completion in the group
    slot: int
    code: str
    digest: str


@dataclass(frozen=True)
class Admitted:
    """A parsed group as the archive stores it: each variant's row (duplicates marked), and its new children."""

    variants: list[list[VariantRow]]  # by completion, in slot order
    new: list[NewVariant]


@dataclass(frozen=True)
class GroupResult:
    """One stored group: its new children (to be queued), the parent they came from, and how its variants parsed."""

    index: int  # the group's number in the run (it seeds the group's sampling)
    parent: RankedProgram
    island: int
    children: list[Child]
    statuses: Counter[str]  # variant status → count over the group
    member: str = ""  # the ensemble member that sampled it, and its ask arm
    ask: str = ""
    cost: GroupCost = GroupCost()
    policy_version: int = 0  # the version number of the member's policy that sampled it

    @property
    def produced(self) -> bool:
        return bool(self.children)


@dataclass(frozen=True)
class EvaluationResult:
    """One child as the sandbox scored it, with when the sandbox got it and when its reply came back."""

    child: Child
    outcome: EvalOutcome
    started_at: datetime
    finished_at: datetime


@dataclass(frozen=True)
class StoredChild:
    """What became of one evaluated child once its batch was committed: its program row (`created` False when the
    same code was stored meanwhile, which then counts nothing), its outcome and the scalar view it ranks by."""

    child: Child
    outcome: EvalOutcome
    scalar: float
    program_id: int
    created: bool
