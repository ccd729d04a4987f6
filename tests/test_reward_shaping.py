"""Reward shaping for a model that mostly copies (policies/shaping.py): each option changes the advantages or the
batch in a way pinned here with numbers worked out by hand, and each is an option of the run, stored with it."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from evolve.archive import Archive
from evolve.cli import app
from evolve.options import RunOverrides
from evolve.problem import load_problem
from evolve.runs import open_run, resolve_options
from evolve.search import train_config
from policies.advantages import GRPO, VPO, vpo_advantages
from policies.shaping import Selected, group_normalise, select, shape_rewards
from policies.training_groups import TrainingCompletion, TrainingGroup
from tests.helpers import SQUARE_SEED, SQUARE_TOML, write_problem

EPS = 1e-6


def z(values: list[float]) -> np.ndarray:
    """The estimators' group normalisation: (R - mean) / (population std + 1e-6)."""
    r = np.array(values)
    return (r - r.mean()) / (r.std() + EPS)


def group(
    answers: list[list[list[float]]], wasted: list[list[bool]] | None = None, prompt_id: int = 1
) -> TrainingGroup:
    """A training group whose completion i has answers[i] (m rows of D rewards) and wasted-answer mask wasted[i]."""
    completions = [
        TrainingCompletion(
            completion_id=10 * prompt_id + i,
            token_ids=[1, 2, 3],
            logprobs=[-0.1, -0.2, -0.3],
            temperature=0.7,
            answers=np.array(rows, dtype=np.float64),
            wasted=None if wasted is None else np.array(wasted[i]),
        )
        for i, rows in enumerate(answers)
    ]
    return TrainingGroup(prompt_id, "prompt", completions)


def seeds():
    return 0


def test_group_normalisation_gives_a_component_with_a_narrow_spread_its_say_in_the_scalarisation():
    # Three completions, one answer each, two components. Component 0 spreads over 0.2, component 1 over 0.06.
    rewards = np.array([[[0.8, 0.50]], [[0.6, 0.56]], [[0.65, 0.55]]])
    # By the bounds the mean is 0.65, 0.58, 0.60: A wins on the wide component alone.
    np.testing.assert_allclose(GRPO()(rewards), z([0.65, 0.58, 0.60]), rtol=1e-12)
    # Stretched per component over the group: c0 -> 1, 0, 0.25; c1 -> 0, 1, 5/6; means 0.5, 0.5, 13/24: C wins.
    stretched = group_normalise(rewards)
    np.testing.assert_allclose(stretched[:, 0], [[1.0, 0.0], [0.0, 1.0], [0.25, 5 / 6]], rtol=1e-12)
    shaped = shape_rewards(rewards, np.zeros((3, 1), bool), normalisation="group")
    np.testing.assert_allclose(GRPO()(shaped), z([0.5, 0.5, 13 / 24]), rtol=1e-9)
    # A component the whole group shares carries nothing inside it, and zero rows (failures) stay at the bottom.
    flat = group_normalise(np.array([[[0.7, 0.0], [0.0, 0.0]], [[0.7, 0.35], [0.7, 0.7]]]))
    np.testing.assert_allclose(flat[..., 0], [[1.0, 0.0], [1.0, 1.0]])
    np.testing.assert_allclose(flat[..., 1], [[0.0, 0.0], [0.5, 1.0]])
    with pytest.raises(ValueError, match="use bounds, group or improvement"):
        shape_rewards(rewards, np.zeros((3, 1), bool), normalisation="zscore")


def test_the_lazy_penalty_puts_every_wasted_answer_below_every_valid_one():
    # m = 2 answers, one component: VPO's set reward is then the best answer (every weight is 1).
    weights = np.array([[1.0]])
    wasted = np.ones((3, 2), bool)  # two completions copied, the third failed twice: all wasted, all zero rows
    rewards = np.zeros((3, 2, 1))
    assert np.array_equal(VPO()(shape_rewards(rewards, wasted, normalisation="bounds")), np.zeros(3))
    assert np.array_equal(
        VPO()(shape_rewards(rewards, wasted, normalisation="bounds", lazy_penalty=-0.5)), np.zeros(3)
    )  # alike: level
    # A poor valid answer (0.0 by the bounds) beside a copy; two copies; two failures. Off: no spread at all.
    mixed = np.zeros((3, 2, 1))
    mask = np.array([[False, True], [True, True], [True, True]])
    assert np.array_equal(vpo_advantages(shape_rewards(mixed, mask, normalisation="bounds"), weights), np.zeros(3))
    on = shape_rewards(mixed, mask, normalisation="bounds", lazy_penalty=-0.5)
    np.testing.assert_allclose(vpo_advantages(on, weights), z([0.0, -0.5, -0.5]), rtol=1e-12)
    np.testing.assert_allclose(vpo_advantages(on, weights), [1.41420756, -0.70710378, -0.70710378], rtol=1e-6)
    # GRPO (the mean of a completion's answers): copying and failing weigh the same, and below a valid answer.
    np.testing.assert_allclose(GRPO()(on), z([-0.25, -0.5, -0.5]), rtol=1e-12)
    # With a penalty the stretch is over the valid answers alone: 0.90 and 0.91 become 0 and 1 (kept in it, the
    # wasted zero row squeezed them to 0.989 and 1.0), the wasted answer the penalty below them.
    close = np.array([[[0.90], [0.0]], [[0.91], [0.0]], [[0.0], [0.0]]])
    two = np.array([[False, True], [False, True], [True, True]])  # the first answers of A and B valid
    spread = shape_rewards(close, two, normalisation="group", lazy_penalty=-0.5)
    np.testing.assert_allclose(spread[..., 0], [[0.0, -0.5], [1.0, -0.5], [-0.5, -0.5]], atol=1e-12)
    np.testing.assert_allclose(GRPO()(spread), z([-0.25, 0.25, -0.5]), rtol=1e-9)
    alone = shape_rewards(close, np.ones((3, 2), bool), normalisation="group", lazy_penalty=-0.5)
    assert np.array_equal(alone, np.full((3, 2, 1), -0.5))  # nothing valid: all penalised alike
    # 0 is off in both normalisations: a wasted answer stays a zero row, the bottom of its group.
    valid = np.array([[[0.4], [0.0]], [[0.0], [0.0]], [[0.0], [0.0]]])
    stretched = shape_rewards(valid, mask, normalisation="group", lazy_penalty=0.0)
    assert np.array_equal(stretched[..., 0], [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])


def test_zero_advantage_groups_stay_out_of_the_batch_unless_asked_to_dilute_it():
    useful = group([[[1.0]], [[0.0]]], prompt_id=1)  # GRPO advantages +1, -1 (up to the 1e-6)
    barren = group([[[0.3]], [[0.3]]], prompt_id=2)  # no spread: both advantages 0
    mixed = group([[[0.2]], [[0.2]], [[0.8]], [[0.2]]], prompt_id=3)  # three equal, one better
    groups = [useful, barren, mixed]
    a = float(z([1.0, 0.0])[0])  # 0.5 / (0.5 + 1e-6)
    m = z([0.2, 0.2, 0.8, 0.2])

    picked = select(groups, GRPO(), seeds)
    chosen, skipped = picked.chosen, picked.skipped
    assert chosen == [
        Selected(0, 0, pytest.approx(a)),
        Selected(0, 1, pytest.approx(-a)),
        *(Selected(2, i, pytest.approx(float(m[i]))) for i in range(4)),
    ]
    assert dict(skipped) == {"all advantages zero": 1}

    picked = select(groups, GRPO(), seeds, skip_zero_advantage=False)
    kept, noted = picked.chosen, picked.skipped
    assert [(s.group, s.completion, round(s.advantage, 6)) for s in kept] == [
        (0, 0, round(a, 6)),
        (0, 1, round(-a, 6)),
        (1, 0, 0.0),
        (1, 1, 0.0),
        *((2, i, round(float(m[i]), 6)) for i in range(4)),
    ]
    assert dict(noted) == {"all advantages zero (kept)": 1}


def test_the_options_come_from_the_problems_training_section_and_flags_and_are_stored_with_the_run(tmp_path):
    toml = SQUARE_TOML + '\n[training]\nlazy_penalty = -0.25\nreward_normalisation = "group"\n'
    problem = load_problem(write_problem(tmp_path / "sq", seed=SQUARE_SEED, toml=toml))
    options = resolve_options(problem, None, RunOverrides(skip_zero_advantage=False)).options
    assert (options.skip_zero_advantage, options.lazy_penalty, options.reward_normalisation) == (False, -0.25, "group")
    flag_wins = resolve_options(problem, None, RunOverrides(lazy_penalty=0.0, reward_normalisation="bounds")).options
    assert (flag_wins.lazy_penalty, flag_wins.reward_normalisation) == (0.0, "bounds")
    config = train_config(options, versions_back=7)  # what each update runs with, stored with its version
    assert (config.skip_zero_advantage, config.lazy_penalty, config.reward_normalisation) == (False, -0.25, "group")
    assert config.versions_back == 7
    archive = Archive(tmp_path / "a.db")
    run = open_run(archive, problem, options).run
    stored = archive.summarize(run, {}).options  # what `evolve inspect --json` prints
    assert (stored["skip_zero_advantage"], stored["lazy_penalty"], stored["reward_normalisation"]) == (
        False,
        -0.25,
        "group",
    )
    archive.close()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lazy-penalty", "0.5"], "--lazy-penalty 0.5: give a value <= 0"),
        (["--lazy-penalty", "nan"], "--lazy-penalty nan: give a finite number"),  # advantages would be NaN
        (["--lazy-penalty", "-inf"], "--lazy-penalty -inf: give a finite number"),
        (["--reward-normalisation", "zscore"], "--reward-normalisation zscore: use bounds, group or improvement"),
    ],
)
def test_a_shaping_flag_that_cannot_work_is_one_line_and_exit_2(tmp_path, flags, message):
    folder = write_problem(tmp_path / "sq", seed=SQUARE_SEED, toml=SQUARE_TOML)
    for command in (["run", str(folder), "--db", str(tmp_path / "a.db")], ["train", str(tmp_path / "a.db")]):
        result = CliRunner().invoke(app, [*command, *flags])
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], result.output
    assert not (tmp_path / "a.db").exists()  # refused before anything was opened
