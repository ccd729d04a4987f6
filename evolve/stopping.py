"""When a run stops by itself: solved, target, patience, a stall, and repeated systemic failure.

A run left alone for days must neither die of one bad input nor spin forever on a broken part. One
unexpected exception costs one group or one child (the loop records it and goes on); only the same kind of
failure at the same stage `max_failures` times in a row is systemic, and stops the run with one line. A run
whose groups stop producing new children stalls after a few of them (minutes on a laptop, not an hour), also
with one line that says what the policy wrote instead, what the run tried, and what to change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from evolve.yields import COPIES, UNPARSEABLE, Yield


@dataclass
class Patience:
    """No new best scalar in `limit` evaluations ends the run (None: never)."""

    limit: int | None
    best: float | None = None
    best_at: int = 0  # the evaluation count when the best last improved

    def observe(self, evaluations: int, scalar: float | None) -> None:
        if scalar is not None and (self.best is None or scalar > self.best):
            self.best, self.best_at = scalar, evaluations

    def exhausted(self, evaluations: int) -> bool:
        return self.limit is not None and evaluations - self.best_at >= self.limit


@dataclass
class FailureStreaks:
    """Consecutive unexpected failures per stage; the same kind `limit` times in a row is systemic."""

    limit: int
    streaks: dict[str, tuple[str, int]] = field(default_factory=dict)  # stage → (kind, count)

    def failed(self, stage: str, kind: str) -> int:
        """Count one failure; returns the length of the streak it extends (or starts)."""
        held, count = self.streaks.get(stage, ("", 0))
        count = count + 1 if held == kind else 1
        self.streaks[stage] = (kind, count)
        return count

    def succeeded(self, stage: str) -> None:
        self.streaks.pop(stage, None)

    def systemic(self, count: int) -> bool:
        return count >= self.limit


@dataclass
class Stall:
    """Groups in a row that made no new child, and what their variants were instead; `limit` of them end the run.

    A barren group lengthens the streak only while no child waits or is under evaluation: the parents those
    children become may unblock the policy. The adapter (`evolve.ask_arms`) reads the same streak to decide what to
    ask differently, so the stop and the changes before it agree on what "barren" means.
    """

    limit: int
    barren: int = 0
    statuses: Counter[str] = field(default_factory=Counter)  # variant statuses over the current streak

    def observe(self, produced: bool, pending: bool, statuses: Mapping[str, int]) -> bool:
        """Count one group; True when it lengthened the streak."""
        if produced:
            self.barren = 0
            self.statuses.clear()
            return False
        self.statuses.update(statuses)
        if pending:
            return False
        self.barren += 1
        return True

    @property
    def stalled(self) -> bool:
        return self.limit > 0 and self.barren >= self.limit  # 0: never

    @property
    def copying(self) -> bool:
        """Copies of known code outnumber (or match) answers that made no program at all."""
        return sum(self.statuses[s] for s in COPIES) >= sum(self.statuses[s] for s in UNPARSEABLE)

    def why(self) -> str:
        return f"{self.barren} groups without a new child: {Yield(statuses=self.statuses).shares()}"

    def message(self, tried: str, now: str) -> str:
        """The one line a stalled run ends with."""
        if self.copying:
            fix = "the model keeps copying: say in the description what to change, or use a larger --policy"
        else:
            fix = "the model's answers do not parse: use a larger --policy or a shorter editable block"
        return (
            f"stalled: {self.why()} (tried: {tried or 'nothing else'}; now asking for {now}); {fix}, "
            "or resume with a larger --stall-groups"
        )
