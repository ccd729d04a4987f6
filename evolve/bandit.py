"""Sharing groups among arms (ensemble members, or ways of asking) by the value each has brought per cost.

Thompson sampling over a Gamma–Poisson model: an arm's value (new valid children, improvements over the parent,
new bests) is treated as events arriving at an unknown rate per unit of cost (1,000 tokens, or 10 seconds), with
a Gamma prior worth one unit of cost at the arm's prior rate (its weight). Each choice draws one rate per arm from
its posterior, Gamma(prior + value, 1 + cost), and takes the largest. Why Thompson rather than UCB: value per
cost is a rate, and its conjugate posterior makes "per cost" exact instead of a ratio of two means with a bonus
whose scale must be tuned by hand; an arm whose value arrives late (children are scored after their group
is sampled) is not over-explored, since Thompson needs no count-based bonus that grows while credit is pending;
and a prior weight is a plain prior rate.

Around the draw: every arm first gets `warmup` groups in turn, and an arm whose share of the groups falls below
the floor (default a fifth of an equal share, at most 10%: 10% of the groups each with two arms, 5% with four)
gets the next one, so no arm starves while the exploration it forces stays within a fifth of the groups. The
draws come from a generator seeded by (run seed, group index): the same seed and outcomes give the same choices.

`uniform` takes turns; `weights` keeps each arm's share at its weight's share (the baselines the benchmark
compares the bandit with).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

ALLOCATIONS = ("bandit", "uniform", "weights")
COST_UNIT = {"tokens": 1000.0, "seconds": 10.0}  # one unit of a group's cost: 1k tokens, or 10 s of sampling
PRIOR_COST = 1.0  # units of cost the prior is worth
MAX_FLOOR = 0.1


class AllocationError(ValueError):
    """An unknown allocation mode."""


@dataclass(frozen=True)
class ArmView:
    """What the allocator reads of one arm."""

    prior: float  # prior value per unit of cost (the member's weight)
    groups: int
    cost: float  # units of cost spent on its groups
    value: float  # value its groups have brought so far


def floor_share(arms: int) -> float:
    """The least share of groups any arm keeps once warmed up."""
    return min(MAX_FLOOR, 0.2 / arms) if arms > 1 else 0.0


class Allocator:
    def __init__(self, mode: str = "bandit", *, warmup: int = 1, floor: float | None = None) -> None:
        if mode not in ALLOCATIONS:
            raise AllocationError(f"allocation {mode!r}: use one of {', '.join(ALLOCATIONS)}")
        self.mode, self.warmup, self.floor = mode, warmup, floor

    def choose(self, arms: Sequence[ArmView], rng: np.random.Generator) -> int:
        """The index of the arm that gets the next group."""
        if len(arms) == 1:
            return 0
        groups = np.array([a.groups for a in arms], dtype=float)
        if self.mode == "uniform":
            return int(np.argmin(groups))
        if self.mode == "weights":
            weights = np.array([a.prior for a in arms], dtype=float)
            deficit = weights / weights.sum() * (groups.sum() + 1) - groups
            return int(np.argmax(deficit))
        for i, arm in enumerate(arms):
            if arm.groups < self.warmup:
                return i
        floor = self.floor if self.floor is not None else floor_share(len(arms))
        owed = floor * groups.sum() - groups
        if owed.max() > 0:
            return int(np.argmax(owed))
        shape = np.array([a.prior + max(a.value, 0.0) for a in arms])
        rate = PRIOR_COST + np.array([a.cost for a in arms])
        return int(np.argmax(rng.gamma(shape, 1.0 / rate)))

    def expected(self, arms: Sequence[ArmView]) -> list[float]:
        """Each arm's posterior mean value per unit of cost (what the views show beside the shares)."""
        return [(a.prior + max(a.value, 0.0)) / (PRIOR_COST + a.cost) for a in arms]
