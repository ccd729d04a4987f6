"""Layering that the import contracts cannot see: which way is better per component is worked out in one place."""

from __future__ import annotations

import ast
from pathlib import Path

from evolve.fitness import solved
from evolve.problem.config import ComponentSpec

ROOT = Path(__file__).resolve().parents[1]
# The problem model declares a component's direction; evolve/fitness.py is the one place that reads it.
MAY_READ_DIRECTION = {"evolve/fitness.py", "evolve/problem/config.py"}


def test_solved_reads_each_bound_in_its_own_direction():
    most = ComponentSpec(name="hits", direction="maximize", bounds=(0.0, 10.0), fail_value=0.0)
    least = ComponentSpec(name="cost", direction="minimize", bounds=(2.0, 50.0), fail_value=50.0)
    assert solved([most, least], {"hits": 10.0, "cost": 2.0})
    assert solved([most, least], {"hits": 11.0, "cost": 1.0})  # past the best bound still counts
    assert not solved([most, least], {"hits": 9.5, "cost": 2.0})
    assert not solved([most, least], {"hits": 10.0, "cost": 2.5})
    assert not solved([most, least], {"hits": 10.0})  # a missing component scores its fail value
    assert not solved([ComponentSpec(name="x", fail_value=0.0)], {"x": 1e9})  # no bounds: never solved
    assert not solved([], {})


def test_only_fitness_reads_a_components_direction():
    readers = []
    for path in sorted([*ROOT.glob("evolve/**/*.py"), *ROOT.glob("policies/**/*.py"), *ROOT.glob("sandboxes/**/*.py")]):
        where = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "direction" and where not in MAY_READ_DIRECTION:
                readers.append(f"{where}:{node.lineno}")
    assert readers == [], "orientation is worked out in evolve/fitness.py only; use fitness.signs/oriented/better"
