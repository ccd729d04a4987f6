"""A row held to a grammar is drawn from the warped distribution restricted to the tokens the grammar allows
(or, when it allows none of them, from the warped distribution of the allowed tokens alone), and the logprob
stored with each token is the log of its probability under exactly that distribution: checked against a dense
reference, by the frequencies of many draws, and on the llama.cpp policy against the torch model's logits and a
full mask of the grammar, on rows where the mask removed the model's most likely token."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from policies.answer_grammar import AnswerShape, answer_gbnf
from policies.policy import SamplingParams
from policies.sampling import TokenSampler, constrained_distribution
from tests.test_sampling import dense, reference

PARAMS = SamplingParams(temperature=0.9, top_p=0.8, max_new_tokens=1, seed=4)


def among(allowed_ids: np.ndarray):
    return lambda ids: np.isin(ids, allowed_ids)


def held_reference(logits: np.ndarray, params: SamplingParams, allowed_ids: np.ndarray) -> np.ndarray:
    """Dense: transformers' warped distribution with the disallowed tokens zeroed and the rest renormalised; when
    that leaves nothing, transformers' warpers run on the logits of the allowed tokens alone."""
    mask = np.zeros(logits.shape[0], dtype=bool)
    mask[allowed_ids] = True
    kept = reference(logits, params) * mask
    if kept.sum() > 0:
        return kept / kept.sum()
    return reference(np.where(mask, logits, -np.inf).astype(np.float32), params)


def test_the_held_distribution_is_the_warped_one_restricted_to_the_allowed_tokens_or_warped_among_them():
    rng = np.random.default_rng(1)
    vocab = 700
    branches = set()
    for trial in range(40):
        logits = (rng.standard_normal(vocab) * 3).astype(np.float32)
        allowed_ids = rng.choice(vocab, size=[3, 60, 400][trial % 3], replace=False)
        nucleus = np.flatnonzero(reference(logits, PARAMS))
        branches.add(bool(np.isin(nucleus, allowed_ids).any()))
        held = constrained_distribution(logits, PARAMS, among(allowed_ids))
        assert held is not None
        np.testing.assert_allclose(dense(*held, vocab), held_reference(logits, PARAMS, allowed_ids), atol=1e-9)
    assert branches == {True, False}  # both cases were met
    assert constrained_distribution(logits, PARAMS, among(np.array([], dtype=np.int64))) is None


@pytest.mark.parametrize("allowed", [[1, 3, 5], [4, 5]], ids=["top-token-removed", "no-nucleus-token-allowed"])
def test_held_draws_follow_the_distribution_whose_logprob_they_carry(allowed):
    logits = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_p=0.8, max_new_tokens=1, seed=3)  # nucleus: tokens 0, 1, 2
    sampler = TokenSampler(params)
    draws = [sampler.draw_held(logits, among(np.array(allowed))) for _ in range(6000)]
    expected = held_reference(logits, params, np.array(allowed))
    counts = np.bincount([token for token, _ in draws], minlength=6) / len(draws)
    np.testing.assert_allclose(counts, expected, atol=0.025)
    for token, logprob in draws[:50]:
        assert logprob == pytest.approx(np.log(expected[token]), abs=1e-9)
    assert expected[0] == 0  # the model's most likely token was never drawn


def test_greedy_under_a_grammar_takes_the_likeliest_allowed_token():
    """At temperature 0 every token but the likeliest has probability 0, and top-p 1 keeps them all in the
    support: where the grammar refuses the likeliest, the allowed tokens of the support carry no mass, so they are
    warped among themselves (the case of no allowed token in the support), not renormalised from zero (0 / 0: a
    pick among NaNs, its logprob NaN). A vLLM stand-in's greedy grammar probe met it (tests/vllm_server.py)."""
    logits = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])).astype(np.float32)
    params = SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=1, seed=3)
    held = constrained_distribution(logits, params, among(np.array([2, 4])))
    assert held is not None and dense(*held, 6).tolist() == [0, 0, 1, 0, 0, 0]
    assert TokenSampler(params).draw_held(logits, among(np.array([2, 4]))) == (2, 0.0)


# ---- the llama.cpp policy, on the tiny model written as a float32 GGUF --------------------------------------
LOGPROB_BOUND = 2e-3  # float32 GGUF against float32 torch (as tests/test_llama_policy.py)


def torch_warped(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Dense probabilities after temperature and top-p, as tests/test_behaviour_logprobs.py computes them."""
    logits = logits / params.temperature
    probs, order = torch.softmax(logits, dim=-1).sort(descending=True)
    cut = torch.zeros_like(logits, dtype=torch.bool).scatter(0, order, probs.cumsum(-1) - probs >= params.top_p)
    return torch.softmax(logits.masked_fill(cut, float("-inf")), dim=-1)


@pytest.mark.slow
def test_the_llama_policy_stores_the_logprob_of_the_masked_distribution_where_the_mask_removed_the_top_token(
    tiny_gguf, tiny_model_dir
):
    from policies.from_spec import make_policy
    from policies.transformers_policy import TransformersPolicy
    from tests.conftest import tiny_pairs

    llama = make_policy(f"llama:{tiny_gguf}")
    local = TransformersPolicy.load(str(tiny_model_dir))
    taught = tiny_pairs()[0][0]  # the tiny model was taught to answer it with two tagged variants: ask for three
    params = SamplingParams(1.0, 0.9, 160, seed=7, stop=("</variant 3>",), structured=AnswerShape(3, "full", "python"))
    removed = fallbacks = 0
    try:
        group = llama.generate(taught, params, 4)
        prompt_ids = local.tokenizer(local.render(taught), add_special_tokens=False).input_ids
        for g in group:
            assert g.text.startswith("<variant 1>\n") and len(g.logprobs) == len(g.token_ids)
            ids = torch.tensor([prompt_ids + g.token_ids])
            with torch.no_grad():
                logits = local.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
            row = llama.grammars.row(answer_gbnf(params.structured))
            try:
                for at, (token, stored) in enumerate(zip(g.token_ids, g.logprobs, strict=True)):
                    allowed = torch.from_numpy(row.allowed(np.arange(logits.shape[1])))
                    warped = torch_warped(logits[at], params)
                    kept = warped * allowed
                    if kept.sum() > 0:
                        expected = kept / kept.sum()
                    else:  # no token of the nucleus allowed: top-p among the allowed tokens alone
                        fallbacks += 1
                        expected = torch_warped(logits[at].masked_fill(~allowed, float("-inf")), params)
                    assert stored == pytest.approx(float(expected[token].log()), abs=LOGPROB_BOUND)
                    if not allowed[int(logits[at].argmax())]:
                        removed += 1  # the model's most likely token was masked out...
                        assert abs(stored - float(warped[token].clamp(min=1e-30).log())) > 0.01  # ...and it counts
                    row.accept(token)
            finally:
                row.close()
    finally:
        llama.close()
    assert removed > 0 and fallbacks > 0, (removed, fallbacks)
