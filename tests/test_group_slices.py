"""What the offline experiment (benchmarks/improve_at_k.py) is built on: an update trains on its step's slice of
the archive's groups (evolve.group_slices), the slices are the same for every method of a training, and the test
across trainings is exact (evolve.devtools.exact_test)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from evolve.archive import Archive
from evolve.devtools.exact_test import permutation_p, sign_flip_p
from evolve.devtools.smoke_archive import smoke_archive
from evolve.group_slices import StepProgress, spread, step_slice
from evolve.training import ArchiveTrainer
from policies.trainer import TrainConfig
from policies.training_groups import TrainingCompletion, TrainingGroup

MINIMIZER = Path(__file__).resolve().parent.parent / "benchmarks" / "problems" / "minimizer"


def group(prompt_id: int, values: list[float]) -> TrainingGroup:
    """A one-component group whose completion i has one answer scoring values[i] (NaN: wasted), parent at 0.5."""
    completions = [
        TrainingCompletion(i, [1], [-0.1], 1.0, np.array([[v]]), np.array([np.isnan(v)])) for i, v in enumerate(values)
    ]
    return TrainingGroup(prompt_id, "p", completions, np.array([0.5]))


def test_a_step_slice_holds_groups_with_spread_only_in_turn_and_alike_for_every_method() -> None:
    flat = [group(pid, [np.nan, np.nan, np.nan]) for pid in (1, 3, 5)]  # all wasted: every method's advantage is 0
    spread_groups = [group(pid, [0.7, 0.4, np.nan]) for pid in (2, 4, 6, 8, 10)]
    loaded = flat + spread_groups
    vpo, grpo = TrainConfig(method="vpo", reward_normalisation="improvement"), TrainConfig(method="grpo")
    assert [spread(g, vpo) for g in loaded] == [False] * 3 + [True] * 5
    steps = [[g.prompt_id for g in step_slice(s, 2, 0, vpo)(loaded)] for s in range(3)]
    assert all(len(ids) == 2 and set(ids) <= {2, 4, 6, 8, 10} for ids in steps)
    assert {pid for ids in steps for pid in ids} == {2, 4, 6, 8, 10}  # 5 groups in turn over 3 steps of 2
    assert steps == [[g.prompt_id for g in step_slice(s, 2, 0, grpo)(loaded[::-1])] for s in range(3)]
    other = [[g.prompt_id for g in step_slice(s, 2, 1, vpo)(loaded)] for s in range(3)]
    assert other != steps  # another training draws another order
    assert step_slice(0, 2, 0, vpo)(flat) == []


def test_spread_is_what_the_estimators_see() -> None:
    """The same answers in another order, and gains below the estimators' 1e-6 floor, teach nothing: not spread.
    Two answers 4e-6 apart do teach (a plain closeness test called them equal); a trade-off GRPO's mean cannot
    see still teaches VPO, so it is offered to every method."""
    config = TrainConfig(reward_normalisation="improvement")

    def two_answer_group(first: list[list[float]], second: list[list[float]]) -> TrainingGroup:
        completions = [
            TrainingCompletion(i, [1], [-0.1], 1.0, np.array(a), np.zeros(len(a), bool))
            for i, a in enumerate((first, second))
        ]
        return TrainingGroup(1, "p", completions, np.zeros(len(first[0])))

    assert not spread(two_answer_group([[0.6], [0.7]], [[0.7], [0.6]]), config)
    assert not spread(two_answer_group([[1e-7], [1e-7]], [[6e-7], [6e-7]]), config)
    assert spread(two_answer_group([[0.9], [0.9]], [[0.900004], [0.900004]]), config)
    assert spread(two_answer_group([[0.7, 0.9], [0.7, 0.9]], [[0.9, 0.7], [0.9, 0.7]]), config)


def test_a_resumed_training_takes_the_slice_after_the_last_step_done(tmp_path: Path) -> None:
    """Steps whose slice taught nothing save no version: the progress file, not the versions, says where to go
    on, and a version newer than the file is a step that ended after its record."""
    progress = StepProgress(tmp_path / "steps.json")
    assert progress.next_step(versions=4) == 4  # before the file existed, every step saved a version
    progress.record(step=0, versions=1)
    progress.record(step=1, versions=1)  # step 1 taught nothing
    progress.record(step=2, versions=2)
    assert progress.next_step(versions=2) == 3
    assert progress.next_step(versions=3) == 4  # killed after step 3 saved its version, before its record


def test_the_permutation_test_is_exact() -> None:
    assert permutation_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(2 / 20)
    assert permutation_p([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0
    with pytest.raises(ValueError):
        permutation_p([], [1.0, 2.0])


def test_the_paired_sign_flip_test_is_exact() -> None:
    """Over 2^n flips: n pairs all one way give 2 / 2^n; pairs that cancel give 1."""
    assert sign_flip_p([0.5, 1.0, 2.0]) == pytest.approx(2 / 8)
    assert sign_flip_p([0.1] * 9) == pytest.approx(2 / 512)
    assert sign_flip_p([1.0, -1.0]) == 1.0
    assert sign_flip_p([1e-13] * 3) == pytest.approx(2 / 8)  # tiny differences are differences
    assert sign_flip_p([0.0, 0.0]) == 1.0
    assert sign_flip_p([3.0, 1.0, -1.0]) == pytest.approx(6 / 8)  # sums 3+-1+-1: 3 of 4 reach |3|, either sign
    with pytest.raises(ValueError):
        sign_flip_p([])
    with pytest.raises(ValueError):
        sign_flip_p([1.0] * 21)


def test_an_update_trains_on_the_groups_its_pick_chose(tmp_path: Path) -> None:
    from policies.tiny import tiny_model, tiny_tokenizer
    from policies.transformers_policy import TransformersPolicy

    tok = tiny_tokenizer()
    tiny_model(tok, seed=0).save_pretrained(tmp_path / "tiny")
    tok.save_pretrained(tmp_path / "tiny")
    db = smoke_archive(tmp_path / "a.db", MINIMIZER, parents=3)
    archive = Archive(db)
    try:
        run = archive.find_run(None)
        config = TrainConfig(learning_rate=1e-3, lora_rank=4)
        components = _components(run.problem_dir)
        policy = TransformersPolicy.load(str(tmp_path / "tiny"))
        trainer = ArchiveTrainer(archive, run.id, components, 2, policy, config, tmp_path / "adapters", 10**6)
        chosen: list[int] = []

        def first_only(groups: list[TrainingGroup]) -> list[TrainingGroup]:
            chosen.append(len(groups))
            return groups[:1]

        picked = trainer.step(pick=first_only)
        everything = trainer.step()
    finally:
        archive.close()
    assert chosen == [3]  # the pick saw every loaded group
    assert (picked.groups, everything.groups) == (1, 3)


def _components(problem_dir: str) -> list:
    from evolve.problem import load_problem

    return list(load_problem(Path(problem_dir)).components)
