"""When a run stops by itself: solved, target, patience, and repeated systemic failure.

A run left alone for days must neither die of one bad input nor spin forever on a broken part. One
unexpected exception costs one group or one child (the loop records it and goes on); only the same kind of
failure at the same stage `max_failures` times in a row is systemic, and stops the run with one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from evolve.problem.config import ComponentSpec


def solved(components: Sequence[ComponentSpec], scores: Mapping[str, float]) -> bool:
    """Every component at its best declared bound (needs bounds on every component)."""
    if not components or any(c.bounds is None for c in components):
        return False
    for c in components:
        low, high = c.bounds  # type: ignore[misc]
        value = float(scores.get(c.name, c.failure))
        if (value < high) if c.direction == "maximize" else (value > low):
            return False
    return True


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
