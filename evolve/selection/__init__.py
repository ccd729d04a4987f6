"""Parent selection over islands of MAP-Elites grids, using the whole score vector."""

from evolve.selection.population import Island, Member, Population
from evolve.selection.selectors import (
    LexicaseSelector,
    ScalarizationSelector,
    Selector,
    TournamentSelector,
    make_selector,
)

__all__ = [
    "Island",
    "LexicaseSelector",
    "Member",
    "Population",
    "ScalarizationSelector",
    "Selector",
    "TournamentSelector",
    "make_selector",
]
