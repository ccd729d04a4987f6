"""The two benchmark problems posed for VPO (issue 61) trade off by construction: scored through the real process
sandbox, each textbook rule is the best on its own component and below the others elsewhere, no rule is best on
every component, and the seed is below a rule a one-line edit reaches (so an untrained model can beat it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolve.problem import load_problem
from tests.helpers import hiding_sandbox

PROBLEMS = Path(__file__).resolve().parent.parent / "benchmarks" / "problems"

# (problem, the seed's return line, {rule: (its return expression, its exact vector to 3 places)})
CASES = [
    (
        "job_priority",
        "return 0",
        {
            "seed": ("0", (0.503, 0.441, 0.418)),
            "shortest first": ('job["time"]', (1.0, 0.364, 0.391)),
            "urgent first": ('(not job["urgent"], job["time"])', (0.442, 1.0, 0.384)),
            "earliest due": ('job["due"]', (0.469, 0.482, 1.0)),
        },
    ),
    (
        "cache_eviction",
        '    return item["added"]',
        {
            "seed": ('item["added"]', (0.911, 0.543, 0.012)),
            "least recent": ('item["last_use"]', (0.949, 0.651, 0.02)),
            "least used": ('item["uses"]', (0.256, 0.969, 0.171)),
            "most recent": ('-item["last_use"]', (0.255, 0.109, 0.996)),
        },
    ),
]


@pytest.mark.parametrize(("name", "seed_line", "rules"), CASES, ids=[c[0] for c in CASES])
def test_each_rule_wins_its_own_component_and_none_wins_all(name: str, seed_line: str, rules: dict) -> None:
    problem = load_problem(PROBLEMS / name)
    assert seed_line in problem.seed_code
    box = hiding_sandbox("process", 2)
    try:
        vectors = {}
        for rule, (expression, want) in rules.items():
            code = problem.seed_code.replace(seed_line, seed_line.replace(seed_line.strip(), f"return {expression}"))
            outcome = box.evaluate(problem, code)
            assert outcome.error_kind is None, (rule, outcome.error)
            vectors[rule] = tuple(round(v, 3) for v in outcome.scores.values())
            assert vectors[rule] == want, (rule, vectors[rule])
    finally:
        box.close()
    rule_vectors = [v for rule, v in vectors.items() if rule != "seed"]
    for d, best in enumerate(rule_vectors):  # rule d is the only best on component d
        assert all(other[d] < best[d] for other in rule_vectors if other is not best)
    assert not any(all(v[d] >= max(o[d] for o in rule_vectors) for d in range(3)) for v in rule_vectors)
    seed_mean = sum(vectors["seed"]) / 3
    assert max(sum(v) / 3 for v in rule_vectors) > seed_mean + 0.05


HOSTILE_CACHE = """    return item["last_use"]


import builtins as _builtins


def enumerate(trace):  # shadows the builtin the fixed simulate() calls: every request looks like the first
    for i, _ in _builtins.enumerate(trace):
        yield i, trace[0]
"""


def test_a_cache_candidate_cannot_report_hits_it_did_not_earn() -> None:
    """The scorer replays the trace with the candidate's evictions: a block that fakes the requests simulate()
    sees (so its own count of hits was 1.12, 1.71 and 1.34 of the optimum before the scorer replayed it) scores 0,
    and so do evictions of keys the cache does not hold; honest programs scored after it keep their exact vectors."""
    problem = load_problem(PROBLEMS / "cache_eviction")
    seed_line = '    return item["added"]\n'
    box = hiding_sandbox("process", 1)
    try:
        faked = box.evaluate(problem, problem.seed_code.replace(seed_line, HOSTILE_CACHE))
        unhashable = box.evaluate(
            problem, problem.seed_code.replace("evicted.append(victim)", "evicted.append([victim])")
        )
        honest = box.evaluate(problem, problem.seed_code.replace(seed_line, '    return item["last_use"]\n'))
        seed = box.evaluate(problem, problem.seed_code)
    finally:
        box.close()
    assert faked.scores == {"shifting": 0.0, "hot_and_scan": 0.0, "loop": 0.0}, faked
    assert "is not in the cache" in (faked.feedback or "")
    assert unhashable.scores == {"shifting": 0.0, "hot_and_scan": 0.0, "loop": 0.0}, unhashable
    assert [round(v, 3) for v in honest.scores.values()] == [0.949, 0.651, 0.02]
    assert [round(v, 3) for v in seed.scores.values()] == [0.911, 0.543, 0.012]
