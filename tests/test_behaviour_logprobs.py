"""The logprob stored with each sampled token is that of the distribution it was drawn from (after temperature,
top-k and top-p), for the transformers backend and the vLLM HTTP backend alike; the trainer's recomputation at
the sampling temperature agrees with it while the weights are unchanged, so the importance weight is 1."""

from __future__ import annotations

import pytest
import torch

from policies.http_policy import HttpPolicy
from policies.policy import SamplingParams
from policies.trainer import PolicyTrainer, Sample, TrainConfig
from policies.transformers_policy import TransformersPolicy
from tests.openai_server import LoopbackServer

pytestmark = pytest.mark.slow
PROMPT = "Square the input."


def warped_logprobs(model, prompt_ids, completion_ids, params: SamplingParams) -> torch.Tensor:
    """Recomputed independently of transformers' warpers: one teacher-forced forward pass, logits / T, the
    top-k cut, then the smallest set of tokens whose mass reaches top-p, renormalised."""
    ids = torch.tensor([prompt_ids + completion_ids], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float() / params.temperature
    if params.top_k > 0:
        kth = logits.topk(params.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        probs, order = torch.softmax(logits, dim=-1).sort(dim=-1, descending=True)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked strictly higher
        cut = torch.zeros_like(logits, dtype=torch.bool).scatter(1, order, mass_before >= params.top_p)
        logits = logits.masked_fill(cut, float("-inf"))
    picked = torch.log_softmax(logits, dim=-1).gather(1, ids[0, len(prompt_ids) :, None]).squeeze(1)
    return picked


def raw_logprobs(model, prompt_ids, completion_ids) -> torch.Tensor:
    unwarped = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=1)
    return warped_logprobs(model, prompt_ids, completion_ids, unwarped)


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    return TransformersPolicy.load(str(tiny_model_dir))


def _prompt_ids(policy: TransformersPolicy) -> list[int]:
    return policy.tokenizer(policy.render(PROMPT), add_special_tokens=False).input_ids


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=120, seed=5),
        SamplingParams(temperature=1.3, top_p=0.9, max_new_tokens=120, seed=6, top_k=12),
    ],
    ids=["defaults", "hot-with-top-k"],
)
def test_transformers_stores_the_warped_logprob_of_every_token(policy, params):
    prompt_ids = _prompt_ids(policy)
    group = policy.generate(PROMPT, params, 4)
    gaps_to_raw = []
    for g in group:
        assert g.token_ids and len(g.logprobs) == len(g.token_ids)
        stored = torch.tensor(g.logprobs)
        expected = warped_logprobs(policy.model, prompt_ids, g.token_ids, params)
        torch.testing.assert_close(stored, expected, atol=1e-4, rtol=0)
        gaps_to_raw.append((stored - raw_logprobs(policy.model, prompt_ids, g.token_ids)).abs().mean())
    assert float(torch.stack(gaps_to_raw).mean()) > 1e-2  # the raw logprobs would not have passed


def test_temperature_zero_is_greedy_with_a_logprob_of_zero_per_token(policy):
    """Temperature 0 asks for the likeliest token at each step (as vLLM and llama.cpp read it; the openai policy's
    grammar probe sends it): every row the same, each token the argmax, drawn with probability 1."""
    prompt_ids = _prompt_ids(policy)
    group = policy.generate(PROMPT, SamplingParams(temperature=0.0, top_p=1.0, max_new_tokens=40, seed=1), 3)
    assert len({tuple(g.token_ids) for g in group}) == 1 and all(lp == 0.0 for lp in group[0].logprobs)
    ids = torch.tensor([prompt_ids + group[0].token_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
    assert logits.argmax(dim=-1).tolist() == group[0].token_ids


def test_trainer_recomputation_matches_the_sampler_so_the_importance_weight_is_one(policy, tiny_model_dir):
    params = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=120, seed=9)
    local = TransformersPolicy.load(str(tiny_model_dir))
    trainer = PolicyTrainer(local.model, local.tokenizer, local.render, TrainConfig(lora_rank=4))
    local.model = trainer.model  # a fresh LoRA adapter: the weights are unchanged
    prompt_ids = _prompt_ids(local)
    gaps, weights = [], []
    for g in local.generate(PROMPT, params, 4):
        with torch.no_grad():
            recomputed = trainer.token_logprobs(Sample(prompt_ids, g.token_ids, g.logprobs, params.temperature, 1.0))
        stored = torch.tensor(g.logprobs)
        gaps.append((recomputed - stored).abs())
        weights.append(torch.exp(recomputed - stored).clamp(max=2.0))
    assert float(torch.cat(gaps).mean()) < 1e-3
    assert float(torch.cat(weights).mean()) == pytest.approx(1.0, abs=1e-3)
    # with a top-p cut the sampler renormalised over the nucleus: the weight is that nucleus's mass, at most 1
    cut = SamplingParams(temperature=0.7, top_p=0.8, max_new_tokens=120, seed=9)
    for g in local.generate(PROMPT, cut, 4):
        with torch.no_grad():
            recomputed = trainer.token_logprobs(Sample(prompt_ids, g.token_ids, g.logprobs, cut.temperature, 1.0))
        assert bool((recomputed <= torch.tensor(g.logprobs) + 1e-4).all())


@pytest.fixture(scope="module")
def processed_server(tiny_model_dir):
    s = LoopbackServer(tiny_model_dir, logprobs_mode="processed_logprobs").start()
    yield s
    s.stop()


def test_vllm_backend_stores_the_warped_logprob_of_every_token(processed_server):
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=120, seed=11, top_k=30)
    policy = HttpPolicy(processed_server.url, processed_server.model_name, max_wait_s=30)
    server_policy = processed_server.policy
    prompt_ids = _prompt_ids(server_policy)
    for g in policy.generate(PROMPT, params, 4):
        expected = warped_logprobs(server_policy.model, prompt_ids, g.token_ids, params)
        torch.testing.assert_close(torch.tensor(g.logprobs), expected, atol=1e-4, rtol=0)


def test_a_server_in_raw_mode_returns_the_unwarped_logprobs(tiny_model_dir):
    """What a vLLM server started without `--logprobs-mode processed_logprobs` gives: docs/policies.md says why
    that flag is required."""
    server = LoopbackServer(tiny_model_dir).start()
    try:
        params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=60, seed=11)
        prompt_ids = _prompt_ids(server.policy)
        for g in HttpPolicy(server.url, server.model_name, max_wait_s=30).generate(PROMPT, params, 2):
            stored = torch.tensor(g.logprobs)
            raw = raw_logprobs(server.policy.model, prompt_ids, g.token_ids)
            torch.testing.assert_close(stored, raw, atol=1e-4, rtol=0)
            assert not torch.allclose(stored, warped_logprobs(server.policy.model, prompt_ids, g.token_ids, params))
    finally:
        server.stop()
