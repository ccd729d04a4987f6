"""What the children brought, live and from the archive: a child that beats its parent is what counts; a child at
the worst value of every component (`zero`, what an evaluator that swallows the candidate's exception scores) is
never valid; a child whose score vector is its parent's exactly is counted apart ("same behaviour"). Real loop
(replayed completions), real process sandbox, real SQLite archive."""

from __future__ import annotations

import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from evolve.archive import summary_yield
from evolve.cli import app
from evolve.fitness import signs
from evolve.loop import run_search
from evolve.yields import QualityCounts, Scale, worst_values
from tests.helpers import SQUARE_SEED, store_program
from tests.test_loop_parts import FOUR, SQUARE, answer, block, wired

ZERO = "def solve(x):\n    return -1\n"  # (0, 0): the worst bound of both components, no error
NINE = "def solve(x):\n    return 9\n"  # (0, 1)
FOUR_AGAIN = "def solve(x):\n    return 2 + 2\n"  # (1, 0): another program, FOUR's behaviour
FAILS = "def solve(x):\n    return x.missing\n"  # an evaluation error


def summary_of(loop):
    components = loop.problem.components
    return loop.archive.summarize(loop.run, signs(components), worst_values(components))


def test_a_zero_child_is_not_counted_valid_live_nor_in_the_summary(tmp_path):
    """The seed scores (0, 0); one completion answers a child at (0, 0) and one at (1, 0). Only the second is a
    new valid child: it beats its parent and is a new best; the first is zero, half of the children evaluated. The
    live view's headline is children that beat their parent."""
    loop = wired(tmp_path, [answer(ZERO, FOUR)], group_size=1, variants=2, max_evaluations=3)
    try:
        assert run_search(loop) == "evaluation budget reached"
        assert loop.stats.new_valid == 1
        live = loop.stats.yields()
        assert live.quality == QualityCounts(evaluated=2, beats_parent=1, improves_component=1, new_best=1, zero=1)
        assert live.zero_share == 0.5
        # nor is the zero child worth its member's credit in the bandit (one valid child, not two)
        assert [t.valid for t in loop.ensemble.tallies.values()] == [1]
        stored = summary_yield(summary_of(loop))
        assert stored.new_valid == 1 and stored.quality == live.quality
        console = Console(width=200, record=True)
        console.print(loop.stats.render())
        headline = console.export_text().splitlines()[0]
        assert headline.startswith("beat parent") and "(1 of 2 children)" in headline
        assert loop.stats.summary().split("yield ")[1].startswith(f"{live.beats_parent_per_1k_tokens:.2f} beating")
        # `evolve inspect` (text and JSON) and the report say the same
        db = str(tmp_path / "a.db")
        shown = CliRunner().invoke(app, ["inspect", db]).output
        assert "children that beat their parent 1 of 2 evaluated" in shown and "zero (worst value on every" in shown
        assert "new bests 1" in shown and "same behaviour as the parent 0" in shown
        [as_json] = json.loads(CliRunner().invoke(app, ["inspect", db, "--json"]).output)
        assert as_json["quality"] == {**vars(live.quality)}
        assert as_json["yields"]["beats_parent"] == 1 and as_json["yields"]["zero_share"] == 0.5
        assert as_json["yields"]["new_valid"] == 1
        report = CliRunner().invoke(app, ["report", db]).output
        assert "children that beat their parent 1 of 2 evaluated" in report
        from evolve.report.build import build_views  # the HTML report's summary line reads it

        assert (
            "beating their parent per 1k tokens (1 of 2 evaluated"
            in build_views(loop.archive, loop.run).meta["quality"]
        )
    finally:
        loop.sandbox.close()
        loop.archive.close()


def test_a_child_equal_to_its_parent_is_same_behaviour_in_a_stored_archive(tmp_path):
    """Programs stored as an archive of the previous code has them (evaluations and parent links, nothing more):
    the summary reads what each child brought from those alone."""
    loop = wired(tmp_path, ["-"])
    run_id = loop.run.id

    def add(code, scores, parent=None, error=None):
        scalar = sum(scores.values()) / 2
        evaluation = {"scores": scores, "scalar": scalar, "duration_s": 0.1, "error_kind": error}
        return store_program(loop.archive, run_id, block(code), evaluation=evaluation, parent_id=parent)[0]

    try:
        seed = add(SQUARE_SEED, {"c0": 0.0, "c1": 0.0})
        four = add(FOUR, {"c0": 1.0, "c1": 0.0}, seed)  # beats its parent, a new best
        add(FOUR_AGAIN, {"c0": 1.0, "c1": 0.0}, four)  # same behaviour: valid, beats nothing
        add(NINE, {"c0": 0.0, "c1": 1.0}, four)  # better on c1, not on the scalar
        add(ZERO, {"c0": 0.0, "c1": 0.0}, four)  # zero
        add(FAILS, {"c0": 0.0, "c1": 0.0}, four, error="runtime")  # an error: evaluated, neither zero nor valid
        add(SQUARE, {"c0": 1.0, "c1": 1.0}, four)  # beats its parent, a new best
        summary = summary_of(loop)
        assert summary.quality == QualityCounts(
            evaluated=6, beats_parent=2, improves_component=3, new_best=2, zero=1, same=1
        )
        y = summary_yield(summary)
        assert y.new_valid == 4 and summary.telemetry["valid_children"] == 4
        assert (
            y.as_dict()["same"] == 1 and y.same_share == pytest.approx(1 / 6) and y.zero_share == pytest.approx(1 / 6)
        )
        # without the worst values (a caller that knows only the signs) 0.0 is each component's worst
        assert loop.archive.summarize(loop.run, signs(loop.problem.components)).quality == summary.quality
    finally:
        loop.sandbox.close()
        loop.archive.close()


def test_what_children_brought_counted_live_equals_the_archive_summary(tmp_path):
    """A run of several groups whose parents selection picks: whatever happened, the live counters and the
    archive's summary count the same children the same way."""
    texts = [
        answer(FOUR, ZERO),
        answer(FOUR_AGAIN, NINE),
        answer(SQUARE, FAILS),
        answer("def solve(x):\n    return x * x + 0\n", "def solve(x):\n    return -2\n"),
    ]
    loop = wired(tmp_path, texts, group_size=2, variants=2, max_evaluations=10)
    try:
        run_search(loop)
        live, stored = loop.stats.yields(), summary_yield(summary_of(loop))
        assert live.quality == stored.quality and live.new_valid == stored.new_valid
        assert live.quality.beats_parent >= 1 and live.quality.zero >= 1
        assert live.quality.evaluated == stored.quality.evaluated == loop.stats.session_evaluations - 1
        # (a replayed completion carries no token count: tests/test_yield_loop.py compares the per-1k figures)
    finally:
        loop.sandbox.close()
        loop.archive.close()


def test_the_zero_rule_reads_declared_bounds_and_directions_then_fail_values():
    from evolve.problem.config import ComponentSpec

    components = [
        ComponentSpec(name="up", bounds=(0.0, 1.0)),
        ComponentSpec(name="down", direction="minimize", bounds=(0.0, 10.0)),
        ComponentSpec(name="free", fail_value=-1.0),
    ]
    scale = Scale(signs(components), worst_values(components))
    assert scale.worst == {"up": 0.0, "down": 10.0, "free": -1.0}
    assert scale.is_zero({"up": 0.0, "down": 10.0, "free": -1.0})
    assert scale.is_zero({"up": -3.0, "down": 12.0})  # beyond the worst, and a missing component, count as there
    assert not scale.is_zero({"up": 0.0, "down": 9.0, "free": -1.0})
    assert not scale.is_zero({"up": 0.0, "down": 10.0, "free": 0.0})
