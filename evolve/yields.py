"""Yield: how many new, valid children the policy's completions turn into, how many of them beat their parent,
and where the rest went.

A small model mostly fails by echoing its parent, repeating a known program or writing something unparseable;
these shares tell a user (and, through `evolve.stopping.Stall`, the adapter in `evolve.ask_arms`) which of those is
happening. A new program that runs is not yet progress: evaluators that catch the candidate's exceptions score a
broken child at the worst value of every component with no error, so "valid" alone read as success while nothing
improved. What counts is a child that beats its parent (`QualityCounts`), and a `zero` child is never valid here.

The same figures come live from the loop's counters and afterwards from the archive's summary
(`Archive.summarize`), both through one `QualityTally`, so both views agree. A plain value: it imports nothing of
the engine (the problem's components come in through the `DeclaredComponent` protocol).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Protocol

# Variant statuses that produced no program at all.
UNPARSEABLE = ("parse_error", "apply_error", "outside_block", "bad_blocks", "syntax_error")
COPIES = ("unchanged", "duplicate")  # the parent echoed, or a program already known


class DeclaredComponent(Protocol):
    """What the zero rule reads of a fitness component (`evolve.problem.config.ComponentSpec` is one)."""

    name: str
    bounds: tuple[float, float] | None
    fail_value: float | None

    @property
    def sign(self) -> float: ...


REFUSED = "refused"  # the kind a prompt lists a zero child under (no error kind: the evaluator refused it)


def worst_values(components: Iterable[DeclaredComponent]) -> dict[str, float]:
    """Each component's worst value, as the evaluator reports it: the worst end of its declared bounds (the low
    one when maximised, the high one when minimised); where it declares no bounds, its fail value (what
    OpenEvolve-format problems declare, 0.0); where neither, 0.0 (what an evaluator that swallows the candidate's
    exception writes)."""
    out = {}
    for c in components:
        if c.bounds is not None:
            out[c.name] = c.bounds[0] if c.sign > 0 else c.bounds[1]
        else:
            out[c.name] = c.fail_value if c.fail_value is not None else 0.0
    return out


@dataclass(frozen=True)
class Scale:
    """Which way is better per component (+1 / -1; +1 where not named) and its worst value (`worst_values`; 0.0
    where not named): all a child's verdict needs of the problem. With no `worst` given, the components are the
    ones the scores name."""

    signs: Mapping[str, float] = field(default_factory=dict)
    worst: Mapping[str, float] = field(default_factory=dict)

    def _names(self, scores: Mapping[str, float]) -> Iterable[str]:
        return self.worst.keys() if self.worst else scores.keys()

    def _oriented(self, scores: Mapping[str, float], name: str) -> float:
        worst = self.worst.get(name, 0.0)
        return self.signs.get(name, 1.0) * float(scores.get(name, worst))  # a missing component: its worst

    def is_zero(self, scores: Mapping[str, float]) -> bool:
        """Every component at its worst value or beyond it (a missing one counts as there)."""
        return all(
            self._oriented(scores, n) <= self.signs.get(n, 1.0) * self.worst.get(n, 0.0) for n in self._names(scores)
        )

    def improves_any(self, scores: Mapping[str, float], parent: Mapping[str, float]) -> bool:
        """Better than `parent` on at least one component, each in its own direction."""
        names = set(self._names(scores)) | set(self._names(parent))
        return any(self._oriented(scores, n) > self._oriented(parent, n) for n in names)

    def same(self, scores: Mapping[str, float], parent: Mapping[str, float]) -> bool:
        """The very same score vector (exact floats: a program that behaves as its parent on every case)."""
        names = set(self._names(scores)) | set(self._names(parent))
        return all(self._oriented(scores, n) == self._oriented(parent, n) for n in names)


@dataclass(frozen=True)
class ChildVerdict:
    """What one evaluated child brought, as the yield counts it."""

    valid: bool  # evaluated without error and not zero: the only children the headline figures count
    zero: bool  # evaluated without error at the worst value of every component
    same: bool = False  # valid, and its score vector is its parent's exactly
    beats_parent: bool = False  # valid, and its scalar view is above its parent's
    improves_component: bool = False  # valid, and better than its parent on at least one component
    new_best: bool = False  # valid, and its scalar view is above every program's scored before it in the run


@dataclass
class QualityCounts:
    """Counts of evaluated children by what they brought (see `ChildVerdict`); `evaluated` counts errors too."""

    evaluated: int = 0
    beats_parent: int = 0
    improves_component: int = 0
    new_best: int = 0
    zero: int = 0
    same: int = 0

    def add(self, verdict: ChildVerdict) -> None:
        self.evaluated += 1
        self.beats_parent += verdict.beats_parent
        self.improves_component += verdict.improves_component
        self.new_best += verdict.new_best
        self.zero += verdict.zero
        self.same += verdict.same


class QualityTally:
    """Judges children against their parents and the run's best, in the order they were scored.

    It remembers the scores of every program scored without error (parents are found by id, whatever selection
    did with them since) and the best scalar so far. Programs known before counting starts (the seed, a resumed
    run's archive) go in through `known`; children through `child`, which counts them. The loop's ledger feeds it
    as children are committed and the archive's summary feeds it the stored evaluations by program id, which is the
    order they were committed in, so the live counts and the summary's are one computation."""

    def __init__(self, scale: Scale | None = None) -> None:
        self.scale = scale or Scale()
        self.counts = QualityCounts()
        self.best: float | None = None
        self._scores: dict[int, tuple[Mapping[str, float], float]] = {}

    def known(self, program_id: int, scores: Mapping[str, float], scalar: float | None, ok: bool) -> None:
        """A program that is no child to count (a seed, or one scored by an earlier session): a parent to be."""
        if ok and scalar is not None:
            self._remember(program_id, scores, scalar)

    def child(
        self, program_id: int, parent_id: int | None, scores: Mapping[str, float], scalar: float | None, ok: bool
    ) -> ChildVerdict:
        """Count one evaluated child (an error is counted as evaluated, nothing else) and remember it."""
        if not ok or scalar is None:
            verdict = ChildVerdict(valid=False, zero=False)
        elif self.scale.is_zero(scores):
            verdict = ChildVerdict(valid=False, zero=True)
        else:
            parent = self._scores.get(parent_id) if parent_id is not None else None
            same = parent is not None and self.scale.same(scores, parent[0])
            verdict = ChildVerdict(
                valid=True,
                zero=False,
                same=same,
                beats_parent=parent is not None and scalar > parent[1],
                improves_component=parent is not None and self.scale.improves_any(scores, parent[0]),
                new_best=self.best is not None and scalar > self.best,
            )
        self.counts.add(verdict)
        if ok and scalar is not None:
            self._remember(program_id, scores, scalar)
        return verdict

    def _remember(self, program_id: int, scores: Mapping[str, float], scalar: float) -> None:
        self._scores[program_id] = (dict(scores), scalar)
        if self.best is None or scalar > self.best:
            self.best = scalar


@dataclass
class Yield:
    completions: int = 0
    tokens: int = 0
    new_valid: int = 0  # variants that became a new program which evaluated without error and is not zero
    statuses: Mapping[str, int] = field(default_factory=dict)
    cut: int = 0  # completions that stopped at their token budget: their last variant is usually half-written
    quality: QualityCounts = field(default_factory=QualityCounts)

    @property
    def variants(self) -> int:
        return sum(self.statuses.values())

    @property
    def per_completion(self) -> float:
        return self.new_valid / self.completions if self.completions else 0.0

    @property
    def per_1k_tokens(self) -> float:
        return 1000.0 * self.new_valid / self.tokens if self.tokens else 0.0

    @property
    def beats_parent_per_completion(self) -> float:
        return self.quality.beats_parent / self.completions if self.completions else 0.0

    @property
    def beats_parent_per_1k_tokens(self) -> float:
        """The headline figure: children that beat their parent's scalar view, per 1k tokens generated."""
        return 1000.0 * self.quality.beats_parent / self.tokens if self.tokens else 0.0

    @property
    def improves_component_per_1k_tokens(self) -> float:
        return 1000.0 * self.quality.improves_component / self.tokens if self.tokens else 0.0

    @property
    def zero_share(self) -> float:
        """Of the children evaluated (errors included): those that scored the worst value on every component."""
        return self.quality.zero / self.quality.evaluated if self.quality.evaluated else 0.0

    @property
    def same_share(self) -> float:
        """Of the children evaluated: those whose score vector is their parent's exactly."""
        return self.quality.same / self.quality.evaluated if self.quality.evaluated else 0.0

    def share(self, *statuses: str) -> float:
        total = self.variants
        return sum(self.statuses.get(s, 0) for s in statuses) / total if total else 0.0

    @property
    def unchanged(self) -> float:
        return self.share("unchanged")

    @property
    def duplicate(self) -> float:
        return self.share("duplicate")

    @property
    def unparseable(self) -> float:
        return self.share(*UNPARSEABLE)

    @property
    def cut_share(self) -> float:
        """Of completions, not variants: a cut completion is one budget decision (`max_new_tokens`) to revisit."""
        return self.cut / self.completions if self.completions else 0.0

    def variant_shares(self) -> str:
        return (
            f"unchanged {self.unchanged:.0%}, duplicate {self.duplicate:.0%}, unparseable {self.unparseable:.0%}; "
            f"completions cut at the token budget {self.cut_share:.0%}"
        )

    def shares(self) -> str:
        return f"{self.unchanged:.0%} unchanged, {self.duplicate:.0%} duplicate, {self.unparseable:.0%} unparseable"

    def quality_line(self) -> str:
        """What the children brought, the headline first: e.g. `0.40 beating their parent per 1k tokens (3 of 12
        evaluated), 5 better on a component, 1 new best; zero 25%, same behaviour 2`."""
        q = self.quality
        return (
            f"{self.beats_parent_per_1k_tokens:.2f} beating their parent per 1k tokens ({q.beats_parent} of "
            f"{q.evaluated} evaluated, {self.beats_parent_per_completion:.2f} per completion), "
            f"{q.improves_component} better on a component, {q.new_best} new best{'' if q.new_best == 1 else 's'}; "
            f"zero {self.zero_share:.0%}, same behaviour {q.same}"
        )

    def line(self) -> str:
        return (
            f"{self.quality_line()}; {self.per_completion:.2f} new valid children per completion, "
            f"{self.per_1k_tokens:.2f} per 1k tokens; variants {self.variant_shares()}"
        )

    def as_dict(self) -> dict[str, float | int]:
        return {
            "completions": self.completions,
            "tokens": self.tokens,
            "new_valid": self.new_valid,
            "per_completion": self.per_completion,
            "per_1k_tokens": self.per_1k_tokens,
            "unchanged": self.unchanged,
            "duplicate": self.duplicate,
            "unparseable": self.unparseable,
            "cut": self.cut,
            "cut_share": self.cut_share,
            **{f"children_{k}" if k == "evaluated" else k: v for k, v in asdict(self.quality).items()},
            "beats_parent_per_completion": self.beats_parent_per_completion,
            "beats_parent_per_1k_tokens": self.beats_parent_per_1k_tokens,
            "improves_component_per_1k_tokens": self.improves_component_per_1k_tokens,
            "zero_share": self.zero_share,
            "same_share": self.same_share,
        }
