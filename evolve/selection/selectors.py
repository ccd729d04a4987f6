"""Parent selection strategies. Each sees an island's bounded pool and its (k, D) oriented score matrix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from evolve.selection.population import Island, PoolView, RankedProgram


class Selector(Protocol):
    name: str

    def pick(self, island: Island, rng: np.random.Generator) -> RankedProgram: ...


class LexicaseSelector:
    """Epsilon-lexicase: cases in random order, keep those within epsilon (the case's MAD) of the best.

    A specialist that is best on one case survives whenever that case comes first, even when its mean is
    poor, which is how the whole vector steers the search rather than its average.
    """

    name = "lexicase"

    def pick(self, island: Island, rng: np.random.Generator) -> RankedProgram:
        pool, scores = island.pool(), island.matrix()
        alive = np.arange(len(pool))
        eps = np.median(np.abs(scores - np.median(scores, axis=0)), axis=0)
        for d in rng.permutation(scores.shape[1]):
            column = scores[alive, d]
            alive = alive[column >= column.max() - eps[d]]
            if len(alive) == 1:
                break
        return pool[int(rng.choice(alive))]


class ScalarizationSelector:
    """A fresh Dirichlet(1) weight vector per pick over range-normalised components, then the argmax."""

    name = "scalarization"

    def pick(self, island: Island, rng: np.random.Generator) -> RankedProgram:
        pool, scores = island.pool(), island.matrix()
        lo, hi = scores.min(axis=0), scores.max(axis=0)
        unit = (scores - lo) / np.where(hi > lo, hi - lo, 1.0)
        value = unit @ rng.dirichlet(np.ones(scores.shape[1]))
        best = np.flatnonzero(value >= value.max() - 1e-12)
        return pool[int(rng.choice(best))]


class TournamentSelector:
    """Best scalar view among k random members."""

    name = "tournament"

    def __init__(self, k: int = 3) -> None:
        self.k = k

    def pick(self, island: Island, rng: np.random.Generator) -> RankedProgram:
        pool = island.pool()
        entrants = rng.choice(len(pool), size=min(self.k, len(pool)), replace=False)
        return max((pool[int(i)] for i in entrants), key=lambda m: (m.scalar, -m.id))


def make_selector(name: str, n_components: int) -> Selector:
    if name == "auto":
        name = "lexicase" if n_components >= 3 else "tournament"
    table: dict[str, type] = {
        "lexicase": LexicaseSelector,
        "scalarization": ScalarizationSelector,
        "tournament": TournamentSelector,
    }
    if name not in table:
        raise ValueError(f"unknown selection {name!r}; use auto, lexicase, scalarization or tournament")
    return table[name]()


@dataclass(frozen=True)
class Parentage:
    """The parent a prompt asks to improve and the programs shown beside it."""

    parent: RankedProgram
    inspirations: list[RankedProgram]


def pick_parent(pool: PoolView, selector: Selector, rng: np.random.Generator, inspirations: int) -> Parentage:
    """A parent from the island's pool by the selector (parents of spent groups less often: `PoolView.rested`),
    and up to `inspirations` others (the island's best first, then drawn at random). An island with no valid
    program yet falls back to the seed. It reads a detached view (`Population.view`), never the live population."""
    island = pool.island
    if not island.pool():
        if pool.first is None:
            raise LookupError("no program has scored yet: the seed failed its evaluation (see `evolve show`)")
        return Parentage(pool.first, [])
    parent = selector.pick(pool.rested(rng), rng)
    others = [m for m in island.pool() if m.id != parent.id]
    k = min(inspirations, len(others))
    elite = [m for m in island.best(1) if m.id != parent.id][:k]
    rest = [m for m in others if m not in elite]
    extra = [rest[int(i)] for i in rng.choice(len(rest), size=min(k - len(elite), len(rest)), replace=False)]
    return Parentage(parent, elite + extra)
