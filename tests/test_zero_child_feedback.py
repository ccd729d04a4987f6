"""A parent's children that scored the worst value on every component (`zero`, evolve/yields.py) are shown in its
next prompt among the failed attempts, with the evaluator's feedback and the exception their code raised into it:
such a child has no error kind, so before this the model never read why its attempt was refused and wrote it
again. `zero_child_feedback` (off by default: the A/B showed no gain) off gives the prompt of before, byte for
byte; the default is checked too."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from evolve.ask_arms import Ask
from evolve.group_sampler import GroupSampler
from evolve.options import RunOptions
from evolve.selection import TournamentSelector
from evolve.selection.population import RankedProgram
from tests.helpers import SQUARE_SEED, square_run, store_program

REFUSED_FEEDBACK = "points outside the unit square\n3 of 10 points are outside"
NAME_ERROR = {
    "type": "NameError",
    "message": "name 'foo' is not defined",
    "file": "seed.py",
    "line": 3,
    "code": "return foo * x",
    "count": 4,
}
REFUSED_LINE = (
    "- refused (scored 0 on every component): points outside the unit square\n"
    "3 of 10 points are outside\n"
    "its code raised NameError: name 'foo' is not defined (line 3, 4 times) at `return foo * x`"
)
CRASH_LINE = "- crash: Traceback (most recent call last):\nZeroDivisionError: division by zero"
HEADING = "Recent attempts from this program that failed (avoid these mistakes):"


def _child(body: str) -> str:
    return SQUARE_SEED.replace("return x + 1", body)


def _evaluation(c0: float, c1: float, **more: object) -> dict:
    return {"scores": {"c0": c0, "c1": c1}, "scalar": (c0 + c1) / 2, "duration_s": 0.1, **more}


def _family(tmp_path, **options):
    """A seed scored 0.5 with three children, oldest first: one that crashed, one the evaluator refused (zero on
    both components, its NameError swallowed) and a valid one; and the run's sampler with `options`."""
    problem, archive, run, run_options = square_run(tmp_path, **({"zero_child_feedback": True} | options))
    seed, _ = store_program(archive, run.id, SQUARE_SEED, evaluation=_evaluation(0.5, 0.5))
    crash = "Traceback (most recent call last):\nZeroDivisionError: division by zero"
    store_program(
        archive,
        run.id,
        _child("return x / 0"),
        parent_id=seed,
        evaluation=_evaluation(0.0, 0.0, error_kind="crash", error=crash),
    )
    refused = _evaluation(0.0, 0.0, feedback=REFUSED_FEEDBACK, swallowed=[NAME_ERROR])
    store_program(archive, run.id, _child("return foo * x"), parent_id=seed, evaluation=refused)
    valid = _evaluation(0.75, 0.25, feedback="valid child: all points inside")
    store_program(archive, run.id, _child("return x * x + 0"), parent_id=seed, evaluation=valid)
    sampler = GroupSampler(problem, archive, run.id, run_options, TournamentSelector())
    parent = RankedProgram(seed, 0, 0, np.array([0.5, 0.5]), 0.5, len(SQUARE_SEED))
    return sampler, parent, archive


ASK = Ask("full", 0.7, "directed")


def _failures_part(prompt: str) -> str:
    return prompt.split(HEADING + "\n\n")[1].split("\n\n#")[0]


def test_the_next_prompt_shows_a_refused_child_s_feedback_and_swallowed_error_but_not_a_valid_child(tmp_path):
    sampler, parent, archive = _family(tmp_path)
    try:
        prompt = sampler.prompt(parent, [], ASK).text
    finally:
        archive.close()
    assert _failures_part(prompt) == REFUSED_LINE + "\n" + CRASH_LINE  # newest first
    assert "valid child" not in prompt


def test_off_the_prompt_is_today_s_the_crash_alone(tmp_path):
    sampler, parent, archive = _family(tmp_path / "on")
    try:
        on = sampler.prompt(parent, [], ASK).text
        sampler.options = replace(sampler.options, zero_child_feedback=False)
        off = sampler.prompt(parent, [], ASK).text
    finally:
        archive.close()
    assert _failures_part(off) == CRASH_LINE
    assert off == on.replace(REFUSED_LINE + "\n", "")
    assert "refused" not in off and "foo" not in _failures_part(off)


def test_at_most_the_newest_three_children_are_listed_however_many_were_refused(tmp_path):
    sampler, parent, archive = _family(tmp_path)
    for k in range(5):
        said = _evaluation(0.0, 0.0, feedback=f"wrong count {k}")
        store_program(archive, sampler.run_id, _child(f"return [{k}]"), parent_id=parent.id, evaluation=said)
    try:
        prompt = sampler.prompt(parent, [], ASK).text
    finally:
        archive.close()
    assert _failures_part(prompt) == "\n".join(
        f"- refused (scored 0 on every component): wrong count {k}" for k in (4, 3, 2)
    )


def test_it_is_off_unless_asked_for(tmp_path):
    """Off by default: the A/B of docs/yield.md showed no gain at its size (0 children beat their parent either way)."""
    sampler, parent, archive = _family(tmp_path, zero_child_feedback=RunOptions().zero_child_feedback)
    try:
        prompt = sampler.prompt(parent, [], ASK).text
    finally:
        archive.close()
    assert _failures_part(prompt) == CRASH_LINE
