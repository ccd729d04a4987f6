"""Advantage estimators against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.advantages import (
    GRPO,
    VPO,
    MultiRLVR,
    grpo_advantages,
    multi_rlvr_advantages,
    simplex_weights,
    vpo_advantages,
)


def test_hand_computed_set_rewards_with_given_weights():
    weights = np.array([[1.0, 0.0], [0.0, 1.0]])
    rewards = np.array([[[1.0, 0.0], [0.0, 0.0]], [[0.2, 0.2], [0.0, 0.0]]])
    # R_0 = mean(max(1, 0), max(0, 0)) = 0.5; R_1 = mean(0.2, 0.2) = 0.2; mean 0.35, population std 0.15
    expected = np.array([0.15, -0.15]) / (0.15 + 1e-6)
    np.testing.assert_allclose(vpo_advantages(rewards, weights), expected, rtol=1e-12)


def test_two_specialists_beat_two_copies_of_a_better_compromise():
    specialists = [[1.0, 0.0], [0.0, 1.0]]
    compromise = [[0.6, 0.6], [0.6, 0.6]]
    rewards = np.array([specialists, compromise])
    vpo = vpo_advantages(rewards, num_weights=2000, seed=0)
    assert vpo[0] > 0 > vpo[1]  # E[max(w1, w2)] = 0.75 > 0.6
    fixed = multi_rlvr_advantages(rewards)
    assert fixed[0] < 0 < fixed[1]  # one fixed scalarisation prefers the compromise: 0.5 < 0.6


def test_with_one_answer_vpo_is_grpo_on_the_mean_up_to_draw_noise():
    rng = np.random.default_rng(3)
    rewards = rng.random((8, 1, 4))
    vpo = vpo_advantages(rewards, num_weights=20000, seed=1)
    grpo = grpo_advantages(rewards)
    np.testing.assert_allclose(vpo, grpo, atol=0.05)
    np.testing.assert_allclose(GRPO()(rewards), grpo)


def test_zero_std_gives_zeros():
    rewards = np.full((4, 3, 2), 0.5)
    for advantages in (
        vpo_advantages(rewards, seed=0),
        grpo_advantages(rewards[:, :1]),
        multi_rlvr_advantages(rewards),
    ):
        assert np.array_equal(advantages, np.zeros(4))
    assert np.array_equal(vpo_advantages(np.zeros((3, 3, 2)), seed=0), np.zeros(3))


def test_determinism_under_a_seed_and_noise_across_seeds():
    rewards = np.random.default_rng(0).random((6, 3, 3))
    a, b = vpo_advantages(rewards, seed=5), vpo_advantages(rewards, seed=5)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, vpo_advantages(rewards, seed=6))
    np.testing.assert_allclose(VPO()(rewards, seed=5), a)


def test_shapes_and_dtypes_for_numpy_and_torch():
    rewards = np.random.default_rng(1).random((5, 3, 2))
    out = vpo_advantages(rewards, seed=0)
    assert out.shape == (5,) and out.dtype == np.float64
    t = vpo_advantages(torch.tensor(rewards, dtype=torch.float32), seed=0)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.shape == (5,)
    np.testing.assert_allclose(t.numpy(), out, rtol=1e-5)
    assert isinstance(grpo_advantages(torch.tensor(rewards[:, 0])), torch.Tensor)
    assert multi_rlvr_advantages(rewards).shape == (5,) and MultiRLVR()(rewards).shape == (5,)
    with pytest.raises(ValueError, match="shape"):
        vpo_advantages(rewards[:, 0])
    with pytest.raises(ValueError, match="m=1"):
        grpo_advantages(rewards)


def test_advantages_are_zero_mean_unit_std():
    out = vpo_advantages(np.random.default_rng(2).random((8, 3, 3)), seed=0)
    assert abs(out.mean()) < 1e-9 and abs(out.std() - 1) < 1e-4


@pytest.mark.parametrize("sampler", ["dirichlet", "sobol"])
def test_weights_lie_on_the_simplex(sampler):
    w = simplex_weights(64, 3, sampler=sampler, seed=0)
    assert w.shape == (64, 3) and (w >= 0).all()
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    np.testing.assert_allclose(w.mean(axis=0), 1 / 3, atol=0.06)


def test_sobol_estimates_with_less_noise_than_dirichlet():
    rewards = np.random.default_rng(4).random((8, 3, 3))
    exact = vpo_advantages(rewards, num_weights=200_000, seed=0)
    err = {
        s: np.mean(
            [np.abs(vpo_advantages(rewards, num_weights=64, sampler=s, seed=k) - exact).mean() for k in range(20)]
        )
        for s in ("dirichlet", "sobol")
    }
    assert err["sobol"] < err["dirichlet"]
