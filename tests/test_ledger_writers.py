"""The ledger is the one writer of run state, read from the code's syntax (no run, no trace).

Every module of evolve/, policies/ and sandboxes/ is parsed, and a call to a mutator of the run's state (the
ledger, its `RunControl`, population, counters, code index, ensemble record and stop rules) from a module that
may not make it fails here, and so does a write to one of their attributes or to a container they hold. The rule
and how it reads the code are in tests/ledger_rules.py and tests/ledger_normal.py; below, besides the tree
itself, hostile code is planted into a module's syntax tree and each plant must be caught.

tests/test_architecture_path.py traces one child through a run only to write docs/architecture.md's table; this
file is what keeps the rule.
"""

from __future__ import annotations

import ast
import functools
import textwrap

import pytest

from tests.ledger_rules import STAGES, WRITERS, Rule, all_violations, parsed, scanned_sources, writing_queries


@functools.cache
def tree_rule() -> tuple[dict[str, str], Rule]:
    """The tree's sources and its rule, read once for this file's tests."""
    sources = scanned_sources()
    return sources, Rule(parsed(sources))


def test_no_module_changes_the_run_state_but_the_ledger_and_the_loop_through_it():
    sources, rule = tree_rule()
    found = all_violations(sources, rule)
    assert not found, "\n".join(map(str, found))


def test_the_ledgers_queries_write_nothing():
    sources, rule = tree_rule()
    assert writing_queries(sources, rule) == []


def test_a_stage_holds_no_live_part_of_the_ledger():
    """The stages import none of the guarded classes: what they work on comes to them as values."""
    guarded = {cls for _, cls in WRITERS}
    sources, _ = tree_rule()
    held = {
        (module, alias.name)
        for module in STAGES
        for node in ast.walk(ast.parse(sources[module]))
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name in guarded
    }
    assert not held


PLANTED = "population.group_done(parent.id, 1, 0)\nmember.calls.control.release(0)\n"


def test_calls_planted_in_the_group_sampler_are_caught():
    """The issue's two planted calls, put inside `GroupSampler.sample` by rewriting its syntax tree: both found."""
    sources, rule = tree_rule()
    tree = ast.parse(sources["evolve.group_sampler"])
    sample = next(
        n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef) and n.name == "sample"
    )
    sample.body[1:1] = ast.parse(PLANTED).body
    found = {v.guarded for v in rule.violations("evolve.group_sampler", tree)}
    assert found == {"evolve.selection.population.Population", "evolve.control.RunControl"}


def _planted(source: str, function: str, code: str) -> ast.Module:
    """`source` parsed, with `code` put first in the body of its function (or method) `function`."""
    tree = ast.parse(source)
    fn = next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef | ast.FunctionDef) and n.name == function)
    fn.body[0:0] = ast.parse(textwrap.dedent(code)).body
    return tree


POPULATION, CONTROL = "evolve.selection.population.Population", "evolve.control.RunControl"
STATS, SIGNALS, OWNER = "evolve.stats.LoopStats", "the run's stop signals", "the owner of a bound method"
# (module, function planted into, code, what it must be found to change): what a reviewer planted and the rule
# first missed, because it matched the names of receivers rather than what they refer to.
HOSTILE = [
    ("evolve.loop", "group", "p = self.population\np.group_done(1, 1, 0)", POPULATION),
    ("evolve.loop", "group", "c = self.control\nc.finish('x')", CONTROL),
    ("evolve.group_sampler", "sample", "s = ledger.stats\ns.new_valid += 1", STATS),
    ("evolve.loop", "group", "getattr(self.population, 'group_done')(1, 1, 0)", POPULATION),
    ("evolve.group_sampler", "sample", "setattr(ledger.stats, 'new_valid', 9)", STATS),
    ("evolve.group_sampler", "sample", "setattr(ledger.stats, name, 9)", f"(a computed name) {STATS}"),
    ("evolve.group_sampler", "sample", "ledger.stats.errors['x'] += 1", STATS),
    ("evolve.group_sampler", "sample", "ledger.stats.parse.update(x=1)", STATS),
    ("evolve.loop", "group", "(lambda q: q.group_done(1, 1, 0))(self.population)", POPULATION),
    ("evolve.group_sampler", "sample", "self.interrupted.__self__.finish('x')", OWNER),
    ("evolve.policy_calls", "sample", "self.cut.set()", SIGNALS),
    ("evolve.policy_calls", "sample", "self.interrupted.clear()", SIGNALS),
    ("evolve.loop", "group", "self.control.sampling_cut.set()", CONTROL),
]


@pytest.mark.parametrize(("module", "function", "code", "guarded"), HOSTILE, ids=[h[2] for h in HOSTILE])
def test_a_hostile_plant_is_caught(module, function, code, guarded):
    sources, rule = tree_rule()
    found = {v.guarded for v in rule.violations(module, _planted(sources[module], function, code))}
    assert guarded in found, f"{code!r} in {module}.{function} not caught (found {found})"


def test_a_local_of_the_same_name_is_not_the_guarded_object():
    """A trainer's own set called `population` is not the run's population."""
    sources, rule = tree_rule()
    tree = _planted(sources["policies.trainer"], "reward_diversity", "population = set()\npopulation.add(1)")
    assert list(rule.violations("policies.trainer", tree)) == []


def test_a_helper_in_another_module_handed_the_population_is_charged_to_the_caller():
    """The helper's parameter is unannotated and named like nothing guarded: what it is handed decides."""
    sources, _ = tree_rule()
    trees = parsed(sources)
    trees["evolve.handoffs"].body.append(ast.parse("def _done(pop, pid):\n    pop.group_done(pid, 1, 0)").body[0])
    call = "from evolve.handoffs import _done\n_done(self.population, 1)"
    trees["evolve.loop"] = _planted(sources["evolve.loop"], "group", call)
    found = {str(v) for v in Rule(trees).violations("evolve.loop", trees["evolve.loop"])}
    assert any("self.population.group_done(pid, 1, 0)" in v and POPULATION in v for v in found), found


# Queries made to write, each one in its own way (a helper taking `self`, an alias, `setattr`, an event's alias).
WRITING_QUERIES = {
    ("evolve.ledger", "may_start_group"): "_touch(self)",
    ("evolve.ledger", "training_due"): "c = self.control\nc.budget_spent('x')",
    ("evolve.ledger", "parent_pool"): "setattr(self, 'unqueued', 1)",
    ("evolve.control", "may_start_group"): "ev = self.stop\nev.set()",
    ("evolve.control", "status"): "_settle_it(self)",
    ("evolve.control", "stop_reason"): "(lambda c: c.finish('x'))(self)",
}
HELPERS = {
    "evolve.ledger": "def _touch(ledger):\n    ledger.unqueued = 7",
    "evolve.control": "def _settle_it(c):\n    c._settle('x')",
}


def test_queries_that_write_through_a_helper_an_alias_or_setattr_are_found():
    sources, _ = tree_rule()
    trees = parsed(sources)
    for (module, query), code in WRITING_QUERIES.items():
        fn = next(n for n in ast.walk(trees[module]) if isinstance(n, ast.FunctionDef) and n.name == query)
        fn.body[0:0] = ast.parse(code).body
    for module, helper in HELPERS.items():
        trees[module].body.append(ast.parse(helper).body[0])
    rule = Rule(trees)
    sources = {m: ast.unparse(t) for m, t in trees.items()}
    found = writing_queries(sources, rule)
    cls = {"evolve.ledger": "RunLedger", "evolve.control": "RunControl"}
    assert sorted(found) == sorted(f"{cls[m]}.{q}" for m, q in WRITING_QUERIES)
