"""The prompt can name the editable code's functions that the fixed code calls, with their parameters, and say that
every variant must define them (`interface_reminder`): on job_priority's untrained archive 132 of 474 children
evaluated rewrote the fixed caller `schedule` instead of `priority(job)` and crashed on a NameError. The names come
from the program's own text; off (the default: its A/B in docs/yield.md showed no gain), the prompt is the one of
before, byte for byte."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from evolve.archive import Archive
from evolve.ask_arms import Ask
from evolve.group_sampler import GroupSampler
from evolve.options import RunOptions
from evolve.problem import load_problem
from evolve.problem.fixed_code import interface_calls
from evolve.prompts.builder import PromptInputs, build_prompt
from evolve.runs import open_run
from evolve.selection import TournamentSelector
from evolve.selection.population import RankedProgram
from tests.helpers import store_program

JOB_PRIORITY = Path(__file__).resolve().parent.parent / "benchmarks" / "problems" / "job_priority"
RULE = (
    " It calls `priority(job)` from the editable code: every variant must define it, with this name and these "
    "parameters. Write only the editable code, never the fixed code."
)
CLOSING = " Each variant must define `priority(job)`."

TWO_CALLED = """import math

# EVOLVE-BLOCK-START
def score(item, bins=(1, 2)):
    return helper(item)


def helper(item):
    return item


def sort(items):
    return sorted(items)


class Bin(object):
    def score(self, item):
        return item


def weight (
    x,
    y,
):
    return x
# EVOLVE-BLOCK-END


def solve(items):
    # sort(items) and helper(x) would do too
    items.sort()
    return [score(i) + weight(i, 0) for i in items] + [Bin()]
"""

RUST = """// EVOLVE-BLOCK-START
fn solve(mut n: u32) -> String {
    String::new()
}
// EVOLVE-BLOCK-END

fn main() {
    println!("{}", solve(4));
}
"""


def test_the_called_functions_are_read_with_their_parameters_and_helpers_are_left_out():
    seed = (JOB_PRIORITY / "seed.py").read_text()
    assert interface_calls(seed) == ["priority(job)"]
    # not `helper` (named in a comment), `sort` (a method of the list is called) nor `Bin.score` (a method)
    assert interface_calls(TWO_CALLED) == ["score(item, bins=(1, 2))", "weight(x, y)"]
    assert interface_calls(RUST) == ["solve(mut n: u32)"]
    assert interface_calls(RUST.replace("fn solve", "pub(crate) fn solve")) == ["solve(mut n: u32)"]
    assert interface_calls(RUST.replace("fn solve", "fn new").replace("solve(4)", "Vec::new()")) == []
    whole = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return x\n# EVOLVE-BLOCK-END\n"
    assert interface_calls(whole) == []  # nothing outside the block: no caller to name
    assert interface_calls("def solve(x):\n    return x\n") == []  # no markers


def test_on_the_prompt_names_them_twice_and_off_it_is_the_prompt_of_before():
    seed = (JOB_PRIORITY / "seed.py").read_text()
    asked = PromptInputs("Order jobs.", seed, {"flow": 0.5}, None, (), 3, "full", fixed_code=True)
    off = build_prompt(asked)
    on = build_prompt(replace(asked, interface=("priority(job)",)))
    assert RULE in on and on.endswith(CLOSING)
    assert off == on.replace(RULE, "").removesuffix(CLOSING)
    fixed_head = on.split("# Current program")[0]
    assert RULE in fixed_head  # in the run's fixed head: a prompt cache keeps it
    as_edits = build_prompt(replace(asked, edit_format="diff", interface=("priority(job)",)))
    assert as_edits.endswith(" Each variant must keep `priority(job)` defined.")  # an edit must not define it again
    no_fixed = replace(asked, fixed_code=False, interface=("priority(job)",))
    assert build_prompt(no_fixed) == build_prompt(replace(no_fixed, interface=()))


def test_the_run_option_reaches_a_real_group_s_prompt_read_from_the_seed_and_is_off_by_default(tmp_path):
    """The names come from the problem's seed, not the parent: a parent whose signature drifted (or that binds the
    name another way) is not the interface, and the fixed head stays the same for every prompt of the run."""
    problem = load_problem(JOB_PRIORITY)
    archive = Archive(tmp_path / "a.db")
    try:
        options = RunOptions(group_size=2, variants=3, seed=0, interface_reminder=True)
        run = open_run(archive, problem, options).run
        evaluation = {"scores": {"flow": 0.5, "urgent": 0.44, "tardiness": 0.42}, "scalar": 0.45, "duration_s": 0.1}
        drifted = problem.seed_code.replace("def priority(job):", "def priority(j, w=(1, 2)):")
        seed, _ = store_program(archive, run.id, drifted, evaluation=evaluation)
        parent = RankedProgram(seed, 0, 0, np.array([0.5, 0.44, 0.42]), 0.45, len(drifted))
        sampler = GroupSampler(problem, archive, run.id, options, TournamentSelector())
        on = sampler.prompt(parent, [], Ask("full", 0.7, "directed")).text
        sampler.options = replace(options, interface_reminder=RunOptions().interface_reminder)
        default = sampler.prompt(parent, [], Ask("full", 0.7, "directed")).text
    finally:
        archive.close()
    assert RULE in on and on.endswith(CLOSING)
    assert default == on.replace(RULE, "").removesuffix(CLOSING)


def test_the_seed_s_first_call_is_said_after_the_names_in_the_fixed_head_and_only_with_them():
    seed = (JOB_PRIORITY / "seed.py").read_text()
    asked = PromptInputs("Order jobs.", seed, {"flow": 0.5}, None, (), 3, "full", fixed_code=True)
    call = "priority({'time': 11, 'urgent': False, 'due': 272})"
    named = build_prompt(replace(asked, interface=("priority(job)",)))
    shown = build_prompt(replace(asked, interface=("priority(job)",), interface_examples=(call,)))
    said = f" Evaluating the seed, it made the call `{call}`."
    assert shown == named.replace("these parameters.", "these parameters." + said)
    assert said in shown.split("# Current program")[0]  # the run's fixed head: a prompt cache keeps it
    assert build_prompt(replace(asked, interface_examples=(call,))) == build_prompt(asked)  # names off: nothing said
    two = build_prompt(replace(asked, interface=("a(x)", "b(y)"), interface_examples=("a(1)", "b(2)")))
    assert " Evaluating the seed, it made the calls `a(1)` and `b(2)`. " in two
