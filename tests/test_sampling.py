"""The numpy sampler keeps exactly the tokens transformers' temperature/top-k/top-p warpers keep, with the same
renormalised probabilities, on its fast path (nucleus among the top candidates) and its full-sort path alike;
a drawn token's stored logprob is the log of its probability under that distribution; draws are seeded."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LogitsProcessorList

from policies.policy import SamplingParams
from policies.sampling import CANDIDATES, TokenSampler, warped_distribution
from policies.transformers_policy import warper_chain


def reference(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution transformers samples from after its warpers (zeros where a token is cut)."""
    chain = LogitsProcessorList(warper_chain(params))
    scores = chain(torch.zeros((1, 1), dtype=torch.long), torch.tensor(logits[None], dtype=torch.float64))
    return torch.softmax(scores, dim=-1)[0].numpy()


def dense(ids: np.ndarray, probs: np.ndarray, vocab: int) -> np.ndarray:
    out = np.zeros(vocab)
    out[ids] = probs
    return out


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=1),
        SamplingParams(temperature=1.3, top_p=0.9, max_new_tokens=1, top_k=12),
        SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=1, top_k=40),
        SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=1),
        SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=1, top_k=2000),
    ],
    ids=["defaults", "top-k-then-top-p", "top-k-only", "plain", "wide-top-k"],
)
@pytest.mark.parametrize("spread", [0.3, 3.0, 12.0], ids=["flat", "peaked", "very-peaked"])
def test_the_kept_tokens_and_their_probabilities_match_transformers(params, spread):
    rng = np.random.default_rng(int(spread * 10))
    vocab = 4 * CANDIDATES + 37  # a flat row needs more than CANDIDATES tokens to reach top_p: the full-sort path
    for _ in range(5):
        logits = (rng.standard_normal(vocab) * spread).astype(np.float32)
        ids, probs = warped_distribution(logits, params)
        expected = reference(logits, params)
        np.testing.assert_allclose(dense(ids, probs, vocab), expected, atol=1e-9, rtol=1e-6)
        assert set(ids.tolist()) == set(np.flatnonzero(expected).tolist())


def test_a_flat_row_takes_the_full_sort_and_keeps_more_than_the_candidates():
    logits = np.zeros(10 * CANDIDATES, dtype=np.float32)
    ids, probs = warped_distribution(logits, SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=1))
    assert len(ids) == 9 * CANDIDATES  # 90% of equally likely tokens
    assert probs.sum() == pytest.approx(1.0)


def test_a_drawn_token_carries_the_log_of_its_warped_probability_and_draws_repeat_under_a_seed():
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.9, top_p=0.8, max_new_tokens=1, seed=11)
    rows = [(rng.standard_normal(300) * 2).astype(np.float32) for _ in range(50)]
    first, second = TokenSampler(params), TokenSampler(params)
    draws = [first.draw(r) for r in rows]
    assert draws == [second.draw(r) for r in rows]
    for row, (token, logprob) in zip(rows, draws, strict=True):
        expected = reference(row, params)
        assert expected[token] > 0
        assert logprob == pytest.approx(np.log(expected[token]), abs=1e-9)
    other = TokenSampler(SamplingParams(temperature=0.9, top_p=0.8, max_new_tokens=1, seed=12))
    assert [other.draw(r) for r in rows] != draws


def test_draws_follow_the_warped_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float64)).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_p=0.8, max_new_tokens=1, seed=3)
    sampler = TokenSampler(params)
    counts = np.bincount([sampler.draw(logits)[0] for _ in range(4000)], minlength=4)
    # top-p 0.8 keeps {0, 1} (mass before token 2 is 0.8, not below it), renormalised to 0.625 / 0.375
    assert counts[2] == counts[3] == 0
    assert counts[0] / 4000 == pytest.approx(0.625, abs=0.03)
