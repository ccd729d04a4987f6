"""The in-memory index of a run: islands, each a MAP-Elites grid plus per-component champions.

Everything a pick looks at is bounded by the grid size and the number of components, never by the archive,
so selection costs the same at 100 programs and at 100k. The index is rebuilt on start by replaying the
archive's evaluated programs in commit order, which also replays the ring migrations at the same points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from evolve.fitness import oriented_array, oriented_bounds, scalar_bounds
from evolve.problem.config import ComponentSpec

SCORE_BINS = 10
LENGTH_BINS = 16


@dataclass(eq=False)
class RankedProgram:
    """An evaluated program as selection ranks it: its oriented score vector, scalar view and code length (an
    ensemble's member is another thing: evolve.members)."""

    id: int
    island: int
    generation: int
    oriented: np.ndarray  # (D,), larger is better
    scalar: float
    code_length: int


def _unit(value: float, lo: float | None, hi: float | None) -> float:
    """Map a value into [0, 1]: linearly within declared bounds, else through a squashing function."""
    if lo is not None and hi is not None and hi > lo:
        return min(max((value - lo) / (hi - lo), 0.0), 1.0)
    return 0.5 + 0.5 * math.tanh(value)


class FeatureSpace:
    """Maps a member to its grid cell. Features: code_length, score (the scalar view), or a component name."""

    def __init__(self, names: Sequence[str], components: Sequence[ComponentSpec]) -> None:
        self.names = list(names)
        self._index = {c.name: i for i, c in enumerate(components)}
        unknown = [n for n in self.names if n not in ("code_length", "score") and n not in self._index]
        if unknown:
            raise ValueError(f"unknown feature(s) {unknown}; use code_length, score or a component name")
        self._bounds: list[tuple[float | None, float | None]] = [b or (None, None) for b in oriented_bounds(components)]
        self._scalar_bounds: tuple[float | None, float | None] = scalar_bounds(components) or (None, None)

    def cell(self, m: RankedProgram) -> tuple[int, ...]:
        out = []
        for name in self.names:
            if name == "code_length":
                out.append(min(int(2 * math.log2(max(m.code_length, 1))), 2 * LENGTH_BINS))
            elif name == "score":
                out.append(min(int(SCORE_BINS * _unit(m.scalar, *self._scalar_bounds)), SCORE_BINS - 1))
            else:
                i = self._index[name]
                out.append(min(int(SCORE_BINS * _unit(float(m.oriented[i]), *self._bounds[i])), SCORE_BINS - 1))
        return tuple(out)

    def cells(self, code_length: np.ndarray, scalar: np.ndarray, oriented: np.ndarray) -> np.ndarray:
        """`cell` for many members at once, (N, features): what the report's grids read at 100k programs."""

        def unit(values: np.ndarray, lo: float | None, hi: float | None) -> np.ndarray:
            if lo is not None and hi is not None and hi > lo:
                return np.clip((values - lo) / (hi - lo), 0.0, 1.0)
            return 0.5 + 0.5 * np.tanh(values)

        out = []
        for name in self.names:
            if name == "code_length":
                column = np.minimum((2 * np.log2(np.maximum(code_length, 1))).astype(int), 2 * LENGTH_BINS)
            elif name == "score":
                column = np.minimum((SCORE_BINS * unit(scalar, *self._scalar_bounds)).astype(int), SCORE_BINS - 1)
            else:
                i = self._index[name]
                column = np.minimum((SCORE_BINS * unit(oriented[:, i], *self._bounds[i])).astype(int), SCORE_BINS - 1)
            out.append(column)
        return np.stack(out, axis=1) if out else np.zeros((len(scalar), 0), dtype=int)


@dataclass
class Island:
    index: int
    features: FeatureSpace
    grid: dict[tuple[int, ...], RankedProgram] = field(default_factory=dict)
    champions: dict[int, RankedProgram] = field(default_factory=dict)
    size: int = 0  # programs that were offered to this island (its own children and migrants)
    _pool: list[RankedProgram] | None = None
    _matrix: np.ndarray | None = None

    def add(self, m: RankedProgram) -> None:
        self.size += 1
        cell = self.features.cell(m)
        held = self.grid.get(cell)
        changed = False
        if held is None or m.scalar > held.scalar:
            self.grid[cell] = m
            changed = True
        for d, value in enumerate(m.oriented):
            champ = self.champions.get(d)
            if champ is None or value > champ.oriented[d] or (value == champ.oriented[d] and m.scalar > champ.scalar):
                self.champions[d] = m
                changed = True
        if changed:
            self._pool = self._matrix = None

    def pool(self) -> list[RankedProgram]:
        """Grid elites plus component champions, each once, in a stable order."""
        if self._pool is None:
            seen: dict[int, RankedProgram] = {m.id: m for m in self.grid.values()}
            seen.update({m.id: m for m in self.champions.values()})
            self._pool = sorted(seen.values(), key=lambda m: m.id)
        return self._pool

    def matrix(self) -> np.ndarray:
        if self._matrix is None:
            self._matrix = np.stack([m.oriented for m in self.pool()]) if self.pool() else np.zeros((0, 0))
        return self._matrix

    def subset(self, members: list[RankedProgram]) -> Island:
        """A view of some of this island's pool, for one pick (nothing is added to it)."""
        view = Island(self.index, self.features)
        view._pool = members
        return view

    def best(self, k: int) -> list[RankedProgram]:
        return sorted(self.pool(), key=lambda m: (-m.scalar, m.id))[:k]


class Population:
    def __init__(
        self,
        components: Sequence[ComponentSpec],
        *,
        islands: int,
        features: Sequence[str],
        migration_interval: int,
        migration_size: int,
        spent_weight: float = 1.0,
    ) -> None:
        """`spent_weight`: each spent group in a row from a parent (`group_done`) multiplies that parent's chance to
        take part in a pick by it (1: selection ignores how a parent's groups went)."""
        self.components = list(components)
        self.spent_weight = spent_weight
        self.spent: dict[int, int] = {}  # program id → spent groups in a row from it
        space = FeatureSpace(features, components)
        self.islands = [Island(i, space) for i in range(islands)]
        self.migration_interval = migration_interval
        self.migration_size = migration_size
        self.added = 0
        self.migrations = 0
        self.first: RankedProgram | None = None
        self.best: RankedProgram | None = None

    def ranked(
        self, program_id: int, island: int, generation: int, scores: dict[str, float], scalar: float, code_length: int
    ) -> RankedProgram:
        """A stored program as this population ranks it (nothing is added: `add` does that)."""
        vector = oriented_array(self.components, scores)
        return RankedProgram(program_id, island % len(self.islands), generation, vector, scalar, code_length)

    def add(self, m: RankedProgram | None) -> None:
        """Record one evaluated program (None for a failed one: it counts for migration timing only)."""
        self.added += 1
        if m is not None:
            self.first = self.first or m
            if self.best is None or m.scalar > self.best.scalar:
                self.best = m
            self.islands[m.island].add(m)
        if len(self.islands) > 1 and self.added % self.migration_interval == 0:
            self._migrate()

    def group_done(self, parent_id: int, completions: int, new_programs: int | None) -> None:
        """A group from `parent_id` is stored. It is spent when it made fewer new programs than it had completions
        (the yield a search needs: at least one new child per completion); a spent group lengthens the parent's
        streak, any other ends it. `new_programs` None (an archive older than its counts): it ends the streak."""
        if new_programs is None or new_programs >= completions:
            self.spent.pop(parent_id, None)
        else:
            self.spent[parent_id] = self.spent.get(parent_id, 0) + 1

    def view(self, island_index: int) -> PoolView:
        """One island's pool as a pick sees it, copied off this population: what the group sampler is handed, so
        that no stage holds (or can change) the live population. Bounded by the island's pool, never the archive."""
        island = self.islands[island_index]
        pool = island.pool()
        spent = {m.id: self.spent[m.id] for m in pool if m.id in self.spent}
        return PoolView(island.subset(list(pool)), self.first, spent, self.spent_weight)

    def _migrate(self) -> None:
        """Ring migration: each island sends copies of its best to the next one."""
        outgoing = [isl.best(self.migration_size) for isl in self.islands]
        for i, members in enumerate(outgoing):
            for m in members:
                self.islands[(i + 1) % len(self.islands)].add(m)
        self.migrations += 1


@dataclass(frozen=True)
class PoolView:
    """One island's pool at the moment of a pick, detached from the live population: the island's programs, the
    seed (`first`, the fallback of an island with none), and how many spent groups in a row each pool member had
    (`Population.group_done`)."""

    island: Island
    first: RankedProgram | None
    spent: dict[int, int]
    spent_weight: float

    def rested(self, rng: np.random.Generator) -> Island:
        """The island as one pick sees it. A small model asked again from the same parent mostly writes again what
        it wrote before (docs/yield.md: most of its copies), so a parent whose last groups were spent takes part
        with probability `spent_weight` per such group, and the selector chooses among the others; the least spent
        stay when none is drawn. Unchanged (and no draw made) while no member of the island is spent, so a run
        whose groups all yield picks exactly as the selector alone would."""
        island = self.island
        pool = island.pool()
        streaks = [self.spent.get(m.id, 0) for m in pool]
        if self.spent_weight >= 1.0 or not any(streaks):
            return island
        kept = [m for m, n in zip(pool, streaks, strict=True) if not n or rng.random() < self.spent_weight**n]
        if not kept:
            fewest = min(streaks)
            kept = [m for m, n in zip(pool, streaks, strict=True) if n == fewest]
        return island if len(kept) == len(pool) else island.subset(kept)
