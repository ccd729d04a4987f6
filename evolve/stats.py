"""Counters of a running search, and the rich live view drawn from them."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table
from rich.text import Text

from evolve.fitness import score_text
from evolve.yields import QualityTally, Yield


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


@dataclass(frozen=True)
class LiveLines:
    """What the live view reads from the policies rather than the ledger, drawn beside the counters."""

    policy_status: str = ""  # e.g. "waiting for the server"
    sampling: str = ""  # the group being sampled: tokens so far, tok/s, rows done
    sampling_bar: str = ""


@dataclass
class LoopStats:
    components: list[str]
    max_evaluations: int
    max_time_s: float | None
    prior_elapsed_s: float = 0.0
    started: float = field(default_factory=time.monotonic)
    evaluations: int = 0  # all evaluations of the run, earlier sessions included
    session_evaluations: int = 0
    tokens: int = 0  # this session's
    prior_groups: int = 0  # groups stored by earlier sessions of the run
    session_groups: int = 0
    completions: int = 0  # this session's
    cut: int = 0  # this session's completions that stopped at their token budget
    new_valid: int = 0  # this session's variants that became new programs evaluated without error
    policy_version: int = 0
    sandbox: str = ""
    parse: Counter[str] = field(default_factory=Counter)  # this session's variants by status ("ok": a new program)
    errors: Counter[str] = field(default_factory=Counter)  # this session's evaluations by error kind
    best_scalar: float | None = None
    best_id: int | None = None
    best_components: dict[str, float] = field(default_factory=dict)
    island_sizes: list[int] = field(default_factory=list)
    train_updates: int = 0
    train_failures: int = 0
    incidents: int = 0  # unexpected exceptions that cost one group or child (see `evolve inspect`)
    last_train: str = ""
    updating: str = ""  # the policy update in progress, e.g. "from v2" ("" between updates): it may take minutes
    ask: str = ""  # what the newest group asks for: member, edit format, temperature, template (its ask arm)
    arms: list[str] = field(default_factory=list)  # one line per member and ask arm (evolve.ensemble)
    signs: dict[str, float] = field(default_factory=dict)  # +1/-1 per component (fitness.signs); 1 when absent
    # What this session's children brought (beat their parent, zero, same behaviour, new best): the ledger feeds
    # it each scored program, the archive's summary counts the same from the stored evaluations.
    quality: QualityTally = field(default_factory=QualityTally)

    @property
    def groups(self) -> int:
        """All groups of the run, earlier sessions included (the count is held once: the parts it adds up)."""
        return self.prior_groups + self.session_groups

    @property
    def session_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def elapsed_s(self) -> float:
        return self.prior_elapsed_s + self.session_s

    def record_best(self, program_id: int, scalar: float, oriented_by_name: dict[str, float]) -> None:
        """Keep the best scalar and the best oriented value per component (shown with the evaluator's sign)."""
        if self.best_scalar is None or scalar > self.best_scalar:
            self.best_scalar, self.best_id = scalar, program_id
        for name, value in oriented_by_name.items():
            if name not in self.best_components or value > self.best_components[name]:
                self.best_components[name] = value

    def yields(self) -> Yield:
        quality = self.quality.counts
        return Yield(self.completions, self.tokens, self.new_valid, dict(self.parse), cut=self.cut, quality=quality)

    def summary(self) -> str:
        """The run's totals (as `evolve inspect` counts them), then this session's own figures, each scope named:
        after a resume the two differ, and one line that mixed them read as if the archive had lost rows."""
        best = "none" if self.best_scalar is None else f"{score_text(self.best_scalar)} (program {self.best_id})"
        failed = f"({sum(self.errors.values())} failed)"
        if self.session_groups == self.groups and self.session_evaluations == self.evaluations:
            evaluations, groups = _count(self.evaluations, "evaluation"), _count(self.groups, "group")
            scope = f"{evaluations} {failed}, {groups}, best scalar {best}; "
        else:
            scope = (
                f"{_count(self.evaluations, 'evaluation')} and {_count(self.groups, 'group')} in all, best scalar "
                f"{best}; this session {_count(self.session_evaluations, 'evaluation')} {failed} and "
                f"{_count(self.session_groups, 'group')}: "
            )
        return (
            f"{scope}{self.session_evaluations / max(self.session_s, 1e-9) * 60:.1f} evaluations/min, "
            f"{self.tokens / max(self.session_s, 1e-9):.1f} tok/s, {self.parse['ok']} new programs of "
            f"{sum(self.parse.values())} variants, policy v{self.policy_version}; yield {self.yields().line()}"
            f"{self._training()}"
        )

    def _training(self) -> str:
        now = f", updating the policy {self.updating}" if self.updating else ""
        if not (self.train_updates or self.train_failures):
            return now
        return f", {self.train_updates} policy updates ({self.train_failures} failed){now}"

    def render(self, live: LiveLines = LiveLines()) -> Group:
        head = Table.grid(padding=(0, 2))
        remaining = f"{self.max_evaluations - self.evaluations} evals"
        if self.max_time_s:
            remaining += f", {max(self.max_time_s - self.elapsed_s, 0):.0f}s"
        rate = self.session_evaluations / max(self.session_s, 1e-9)
        y = self.yields()
        q = y.quality
        head.add_row(  # the headline: what the tokens bought, children that beat their parent
            "beat parent",
            Text(f"{y.beats_parent_per_1k_tokens:.2f}/1k tokens ({q.beats_parent} of {q.evaluated} children)", "bold"),
            "new bests",
            f"{q.new_best}; better on a component {q.improves_component}",
        )
        head.add_row("elapsed", f"{self.elapsed_s:.0f}s", "remaining", remaining)
        head.add_row(
            "evaluations",
            f"{self.evaluations} ({rate:.2f}/s)",
            "tokens/s",
            f"{self.tokens / max(self.session_s, 1e-9):.1f}",
        )
        head.add_row(
            "new programs",
            f"{self.parse['ok']} of {sum(self.parse.values())} variants {dict(self.parse)}",
            "eval errors",
            f"{sum(self.errors.values()) / max(self.session_evaluations, 1):.0%} {dict(self.errors)}",
        )
        head.add_row(
            "yield",
            f"{y.per_completion:.2f} valid/completion, {y.per_1k_tokens:.2f}/1k tokens",
            "zero / same",
            f"zero {y.zero_share:.0%} ({q.zero}), same behaviour {q.same}",
        )
        head.add_row("", "", "variants", y.variant_shares())
        if self.ask:
            head.add_row("asking", Text(self.ask), "", "")
        for line in self.arms:
            head.add_row("", Text(line), "", "")
        head.add_row("policy version", str(self.policy_version), "sandbox", self.sandbox)
        if live.policy_status:
            head.add_row("policy", Text(live.policy_status), "", "")
        if live.sampling:
            head.add_row("sampling", Text(live.sampling), "", Text(live.sampling_bar))
        if self.last_train or self.updating:
            head.add_row("training", self._training().lstrip(", "), "last update", Text(self.last_train or "-"))
        head.add_row(
            "islands",
            " ".join(map(str, self.island_sizes)),
            "best scalar",
            "-" if self.best_scalar is None else f"{score_text(self.best_scalar)} (#{self.best_id})",
        )
        best = Table(title="best per component", show_edge=False)
        shown = self.components[:12]
        for name in shown:
            best.add_column(name, justify="right")
        best.add_row(*(f"{self.signs.get(n, 1.0) * self.best_components.get(n, float('nan')):.4g}" for n in shown))
        return Group(head, best)
