"""Parent selection over islands of MAP-Elites grids, using the whole score vector."""

from evolve.selection.population import Island, PoolView, Population, RankedProgram
from evolve.selection.selectors import (
    LexicaseSelector,
    Parentage,
    ScalarizationSelector,
    Selector,
    TournamentSelector,
    make_selector,
    pick_parent,
)

__all__ = [
    "Island",
    "LexicaseSelector",
    "Parentage",
    "PoolView",
    "Population",
    "RankedProgram",
    "ScalarizationSelector",
    "Selector",
    "TournamentSelector",
    "make_selector",
    "pick_parent",
]
