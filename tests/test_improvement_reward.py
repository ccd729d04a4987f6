"""The reward for improvement (policies/shaping.py, "improvement"): an answer earns its child's gain over the
parent, and an answer that changed nothing the evaluator sees (a copy, a docstring edit) earns nothing. The older
shapings paid a valid answer for being valid (issue 61); these tests were seen failing on them."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from policies.advantages import GRPO, VPO
from policies.shaping import WASTE_PENALTY, select, shape_rewards
from policies.training_groups import TrainingCompletion, TrainingGroup, normalise

SHAPING = {"normalisation": "improvement"}


def one_answer_group(children: list[list[float] | None], parent: list[float], unchanged: list[bool]) -> TrainingGroup:
    """A group of one-answer completions: a child's oriented vector, or None for a copy (no new program)."""
    completions = [
        TrainingCompletion(
            completion_id=i,
            token_ids=[1, 2],
            logprobs=[-0.1, -0.2],
            temperature=0.7,
            answers=np.array([[np.nan, np.nan] if child is None else child]),
            wasted=np.array([child is None]),
            unchanged=np.array([same]),
        )
        for i, (child, same) in enumerate(zip(children, unchanged, strict=True))
    ]
    return TrainingGroup(1, "prompt", completions, np.array(parent, dtype=np.float64))


@pytest.mark.parametrize("estimator", [VPO(), GRPO()], ids=["vpo", "grpo"])
def test_a_docstring_edit_and_a_copy_earn_nothing_and_a_child_that_beats_its_parent_earns_most(estimator):
    # Declared bounds [0, 2] on both components: the parent scores (1.0, 1.0). A beats it, B is worse on one
    # component, C is a docstring edit (new code, the parent's scores exactly), D a copy.
    group = one_answer_group(
        [[1.2, 1.1], [0.9, 1.0], [1.0, 1.0], None], parent=[1.0, 1.0], unchanged=[False, False, True, False]
    )
    normalise([group], [(0.0, 2.0), (0.0, 2.0)])
    picked = select([group], estimator, lambda: 0, skip_zero_advantage=False, **SHAPING)
    advantage = {s.completion: s.advantage for s in picked.chosen}
    better, worse, docstring, copy = (advantage[i] for i in range(4))
    assert docstring <= 0 and copy <= 0, "a docstring edit and a copy earn nothing"
    assert better > 0 and better > worse and better > docstring
    # The rewards themselves, in units of the range: A gains 0.1 and 0.05; B loses 0.05; C and D the penalty.
    np.testing.assert_allclose(
        picked.shaped[0][:, 0],
        [[0.1, 0.05], [-0.05, 0.0], [-WASTE_PENALTY] * 2, [-WASTE_PENALTY] * 2],
        atol=1e-12,
    )


def test_gains_are_bounded_and_a_parent_without_an_evaluation_measures_from_the_bottom_of_the_range():
    rewards = np.array([[[1.0]], [[0.0]]])  # on the unit scale
    wasted = np.zeros((2, 1), bool)
    far = shape_rewards(rewards, wasted, parent=np.array([-3.0]), **SHAPING)  # an unclipped parent far below
    assert far.max() == 1.0 and far.min() == 1.0
    np.testing.assert_allclose(shape_rewards(rewards, wasted, parent=None, **SHAPING), rewards)
    # A lazy penalty, when set, replaces the default one.
    assert shape_rewards(rewards, np.ones((2, 1), bool), lazy_penalty=-0.2, **SHAPING).max() == -0.2


def test_load_batch_gives_each_group_its_parents_vector_and_marks_the_children_that_score_as_it(tiny_search):
    """The parent's evaluation reaches the training group, on the answers' scale, read in the batch's query."""
    from evolve.archive import Archive
    from evolve.fitness import oriented_array, oriented_bounds
    from evolve.training import load_batch, recent_version_ids

    archive = Archive(tiny_search.db)
    versions = recent_version_ids(archive, tiny_search.run_id, 10**6)
    batch = load_batch(archive, tiny_search.run_id, tiny_search.components, 2, versions)
    archive.close()
    con = sqlite3.connect(tiny_search.db)
    parent_of = dict(con.execute("SELECT id, parent_id FROM prompts"))
    scores = {p: e for p, e in con.execute("SELECT program_id, scores FROM evaluations WHERE error_kind IS NULL")}
    child_scores = {
        (c, s): scores.get(p)
        for c, s, p in con.execute("SELECT completion_id, slot, program_id FROM variants WHERE status = 'ok'")
    }
    bounds = oriented_bounds(tiny_search.components)
    assert all(bounds), "the square problem declares its bounds"
    low, high = (np.array([b[i] for b in bounds]) for i in (0, 1))
    assert batch.groups
    for g in batch.groups:
        parent_scores = json.loads(scores[parent_of[g.prompt_id]])
        expected = (oriented_array(tiny_search.components, parent_scores) - low) / (high - low)
        np.testing.assert_allclose(g.parent, expected)
        for c in g.completions:
            for k in range(2):
                child = child_scores.get((c.completion_id, k))
                same = child is not None and json.loads(child) == parent_scores and not c.wasted[k]
                assert bool(c.unchanged[k]) == same


def _archive_of(path, groups: int):
    """An archive of `groups` groups, each from a parent of its own, of 2 completions with one scored child each."""
    from evolve.archive import Archive, CompletionRecord
    from tests.helpers import store_program

    archive = Archive(path)
    run = archive.create_run("sq", "sq", "fp", {"options": {"variants": 1}}, 0)
    version = archive.add_policy_version(run_id=run.id, base_model="m", number=0)
    for g in range(groups):
        evaluation = {"scores": {"c0": 0.5, "c1": 0.5}, "scalar": 0.5, "duration_s": 0.01}
        parent, _ = store_program(archive, run.id, f"p{g} = 0", evaluation=evaluation)
        completions = [CompletionRecord("c", [1, 2], [-0.1, -0.2], "stop", version) for _ in range(2)]
        variant_ids = archive.add_group(
            run.id,
            parent_id=parent,
            inspiration_ids=[],
            island=0,
            prompt=f"p{g}",
            sampling={"temperature": 0.7},
            completions=completions,
            variants=[[("ok", None, None)], [("ok", None, None)]],
        )
        for i, ((vid,), level) in enumerate(zip(variant_ids, (0.6, 0.5), strict=True)):
            child = {"scores": {"c0": level, "c1": level}, "scalar": level, "duration_s": 0.01}
            store_program(archive, run.id, f"c{g}_{i} = 1", evaluation=child, parent_id=parent, variant_id=vid)
    return archive, run.id, version


def statements_into(statements: list[str]):
    """A `before_cursor_execute` listener that keeps each statement's text."""

    def listener(conn, cursor, statement, *rest):
        statements.append(statement)

    return listener


def test_load_batch_reads_the_parents_in_the_batchs_queries_whatever_its_size(tmp_path):
    """The parents' evaluations come with the groups' prompts: the statements a batch costs do not grow with its
    groups (no query per group or per answer)."""
    from sqlalchemy import event

    from evolve.problem.config import ComponentSpec
    from evolve.training import load_batch

    components = [ComponentSpec(name="c0", bounds=(0.0, 1.0)), ComponentSpec(name="c1", bounds=(0.0, 1.0))]
    counts = []
    for groups in (2, 9):
        archive, run_id, version = _archive_of(tmp_path / f"{groups}.db", groups)
        statements: list[str] = []
        listener = statements_into(statements)
        event.listen(archive.db.engine, "before_cursor_execute", listener)
        batch = load_batch(archive, run_id, components, 1, [version])
        event.remove(archive.db.engine, "before_cursor_execute", listener)
        archive.close()
        assert len(batch.groups) == groups
        for g in batch.groups:
            np.testing.assert_allclose(g.parent, [0.5, 0.5])
            assert [bool(c.unchanged[0]) for c in g.completions] == [False, True]  # 0.6 changed, 0.5 as the parent
        counts.append(len([s for s in statements if s.lstrip().upper().startswith("SELECT")]))
    assert counts[0] == counts[1], counts
