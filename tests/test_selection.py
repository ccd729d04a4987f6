"""Selection uses the whole vector: lexicase keeps specialists that the scalar view would drop."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from evolve.problem.config import ComponentSpec
from evolve.selection import LexicaseSelector, Population, ScalarizationSelector, TournamentSelector, make_selector

COMPONENTS = [ComponentSpec(name=f"c{i}", bounds=(0.0, 1.0)) for i in range(3)]


def _population(vectors: list[list[float]], islands: int = 1, interval: int = 1000) -> Population:
    pop = Population(
        COMPONENTS, islands=islands, features=["code_length", "score"], migration_interval=interval, migration_size=1
    )
    for i, v in enumerate(vectors, 1):
        scores = {f"c{d}": x for d, x in enumerate(v)}
        pop.add(pop.ranked(i, 0, 0, scores, float(np.mean(v)), code_length=100 * i))
    return pop


def test_lexicase_picks_the_specialist_the_scalar_view_never_would():
    # Program 1 is the only one good at c0; programs 2 and 3 are compromises with higher means.
    pop = _population([[1.0, 0.0, 0.0], [0.45, 0.45, 0.45], [0.4, 0.5, 0.4]])
    island = pop.islands[0]
    rng = np.random.default_rng(0)
    lexicase = Counter(LexicaseSelector().pick(island, rng).id for _ in range(600))
    tournament = Counter(TournamentSelector(k=3).pick(island, rng).id for _ in range(600))
    assert tournament == Counter({2: 600})  # the scalar view always takes the best mean
    assert 150 < lexicase[1] < 300  # ~1/3: whenever c0 is looked at first
    assert lexicase[3] > 100  # c1's specialist-ish program survives too


def test_scalarization_visits_every_pareto_member():
    pop = _population([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.2, 0.2, 0.2]])
    rng = np.random.default_rng(1)
    picks = Counter(ScalarizationSelector().pick(pop.islands[0], rng).id for _ in range(600))
    assert set(picks) >= {1, 2, 3}
    assert picks[4] == 0  # dominated by the mixtures of the others under every weight vector


def test_selection_is_deterministic_under_a_seed():
    pop = _population([[1.0, 0.0, 0.0], [0.45, 0.45, 0.45], [0.4, 0.5, 0.4]])
    a = [LexicaseSelector().pick(pop.islands[0], np.random.default_rng(7)).id for _ in range(5)]
    b = [LexicaseSelector().pick(pop.islands[0], np.random.default_rng(7)).id for _ in range(5)]
    assert a == b


def test_pool_stays_bounded_as_the_archive_grows():
    rng = np.random.default_rng(3)
    pop = _population([list(rng.random(3)) for _ in range(5000)])
    pool = pop.islands[0].pool()
    assert len(pool) <= 33 * 10 + 3  # grid cells (length x score) plus one champion per component
    assert pop.islands[0].size == 5000


def test_ring_migration_copies_elites_to_the_next_island_only():
    pop = Population(COMPONENTS, islands=3, features=["score"], migration_interval=3, migration_size=1)
    for i, island in enumerate([0, 1, 2], 1):
        pop.add(pop.ranked(i, island, 0, {"c0": i / 10, "c1": 0.0, "c2": 0.0}, i / 10, 10))
    assert pop.migrations == 1
    ids = [{m.id for m in isl.pool()} for isl in pop.islands]
    assert ids == [{1, 3}, {2, 1}, {3, 2}]


def test_failed_programs_count_for_migration_but_never_enter_a_pool():
    pop = Population(COMPONENTS, islands=2, features=["score"], migration_interval=2, migration_size=1)
    pop.add(pop.ranked(1, 0, 0, {"c0": 0.5, "c1": 0.5, "c2": 0.5}, 0.5, 10))
    pop.add(None)
    assert pop.migrations == 1
    assert [m.id for m in pop.islands[1].pool()] == [1]


def test_minimized_components_are_oriented():
    comps = [
        ComponentSpec(name="loss", direction="minimize", fail_value=1e9),
        ComponentSpec(name="acc", fail_value=0.0),
    ]
    pop = Population(comps, islands=1, features=["loss"], migration_interval=100, migration_size=1)
    m = pop.ranked(1, 0, 0, {"loss": 2.0, "acc": 0.5}, 0.0, 10)
    assert list(m.oriented) == [-2.0, 0.5]


def test_auto_selector_depends_on_component_count():
    assert make_selector("auto", 3).name == "lexicase"
    assert make_selector("auto", 2).name == "tournament"
    with pytest.raises(ValueError, match="unknown selection"):
        make_selector("roulette", 3)
