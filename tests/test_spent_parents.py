"""A parent whose groups were spent (fewer new programs than completions) is picked less often, and a resumed run
knows which parents those were."""

from __future__ import annotations

from collections import Counter

import numpy as np

from evolve.commit import ProgramWriter
from evolve.handoffs import ScoredRun
from evolve.loop import SearchLoop, run_search
from evolve.problem.config import ComponentSpec
from evolve.selection import Population, TournamentSelector, pick_parent
from policies.replay import ReplayPolicy
from sandboxes.process import ProcessSandbox
from tests.helpers import db_rows, square_run

COMPONENTS = [ComponentSpec(name=f"c{i}", bounds=(0.0, 1.0)) for i in range(2)]


def _population(weight: float) -> Population:
    pop = Population(
        COMPONENTS, islands=1, features=["score"], migration_interval=1000, migration_size=1, spent_weight=weight
    )
    for i, value in enumerate([0.2, 0.5, 0.9], 1):  # program 3 is the best: the tournament always takes it
        pop.add(pop.ranked(i, 0, 0, {"c0": value, "c1": value}, value, 10))
    return pop


def _picks(pop: Population, count: int = 800) -> Counter[int]:
    rng = np.random.default_rng(0)
    return Counter(pick_parent(pop.view(0), TournamentSelector(k=3), rng, 0).parent.id for _ in range(count))


def test_a_parent_of_spent_groups_is_picked_less_often_and_a_group_that_yields_restores_it():
    pop = _population(0.5)
    assert _picks(pop) == Counter({3: 800})
    pop.group_done(3, completions=4, new_programs=0)
    pop.group_done(3, completions=4, new_programs=3)  # two spent groups in a row: a quarter of the picks
    picks = _picks(pop)
    assert 150 < picks[3] < 250 and picks[2] == 800 - picks[3]  # the others' best takes the rest
    pop.group_done(3, completions=4, new_programs=4)  # one new program per completion: not spent
    assert _picks(pop) == Counter({3: 800})
    pop.group_done(3, completions=4, new_programs=0)
    pop.group_done(3, completions=4, new_programs=None)  # an archive older than its counts: nothing against it
    assert _picks(pop) == Counter({3: 800})


def test_without_spent_groups_or_with_weight_one_the_picks_are_exactly_the_selectors():
    plain = _population(1.0)
    plain.group_done(3, completions=4, new_programs=0)  # weight 1: spent groups count for nothing
    rng_a, rng_b = np.random.default_rng(5), np.random.default_rng(5)
    island = plain.islands[0]
    mixed = _population(1.0).islands[0]
    ours = [pick_parent(plain.view(0), TournamentSelector(k=2), rng_a, 0) for _ in range(50)]
    theirs = [TournamentSelector(k=2).pick(mixed, rng_b) for _ in range(50)]
    assert [p.parent.id for p in ours] == [m.id for m in theirs]  # no extra draw moved the stream
    assert island.pool() == plain.islands[0].pool()


def test_when_every_member_is_spent_the_least_spent_stay():
    pop = _population(0.0)  # weight 0: a spent parent never takes part while a fresher one exists
    for pid, streak in ((1, 3), (2, 1), (3, 2)):
        for _ in range(streak):
            pop.group_done(pid, completions=2, new_programs=1)
    assert _picks(pop, 50) == Counter({2: 50})


CHILD = "```python\ndef solve(x):\n    return 4\n```"
ECHO = "```python\ndef solve(x):\n    return x + 1\n```"  # the seed again: unchanged from it, a duplicate elsewhere


class OneAtATime(ReplayPolicy):
    max_concurrency = 1


def test_the_ledger_counts_spent_groups_as_they_land_and_a_resume_rebuilds_the_same_streaks(tmp_path):
    """The live streaks after a run equal those a fresh session rebuilds from the archive alone (a resume after
    `kill -9` picks as the killed session would have)."""
    problem, archive, run, options = square_run(
        tmp_path, variants=1, group_size=2, max_evaluations=100, max_groups=6, stall_groups=0
    )
    policy = OneAtATime([CHILD, ECHO] + [ECHO] * 10)
    loop = SearchLoop(problem, archive, policy, ProcessSandbox(2), run, options)
    run_search(loop)
    live = dict(loop.population.spent)
    groups = db_rows(tmp_path / "a.db", "SELECT parent_id, parse_counts FROM prompts ORDER BY id")
    assert len(groups) == 6 and '"ok": 1' in groups[0][1]  # the first group made the child, every other none
    assert sum(live.values()) >= 1 and set(live) <= {pid for pid, _ in groups}
    scored = ProgramWriter(problem, archive, run.id).replay()
    assert [(g.parent_id, g.completions, g.new_programs) for g in scored.groups] == [
        (p, 2, 1 if '"ok"' in c else 0) for p, c in groups
    ]
    resumed = SearchLoop(problem, archive, policy, ProcessSandbox(1), archive.find_run(run.id), options)
    resumed.ledger.replay(scored)  # what a resumed session does first
    assert resumed.population.spent == live
    blind = SearchLoop(problem, archive, policy, ProcessSandbox(1), archive.find_run(run.id), options)
    blind.ledger.replay(ScoredRun(scored.programs, scored.code_index))  # its programs alone, as before
    assert blind.population.spent == {} != live
    archive.close()
