"""Parent selection strategies. Each sees an island's bounded pool and its (k, D) oriented score matrix."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from evolve.selection.population import Island, Member


class Selector(Protocol):
    name: str

    def pick(self, island: Island, rng: np.random.Generator) -> Member: ...


class LexicaseSelector:
    """Epsilon-lexicase: cases in random order, keep those within epsilon (the case's MAD) of the best.

    A specialist that is best on one case survives whenever that case comes first, even when its mean is
    poor, which is how the whole vector steers the search rather than its average.
    """

    name = "lexicase"

    def pick(self, island: Island, rng: np.random.Generator) -> Member:
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

    def pick(self, island: Island, rng: np.random.Generator) -> Member:
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

    def pick(self, island: Island, rng: np.random.Generator) -> Member:
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
