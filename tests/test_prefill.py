"""The prompt is prefilled once per group. Where bf16 is slow (a CPU without native bf16), a float32 twin of the
model does it and decoding stays in bf16; the twin follows every change of weights."""

from __future__ import annotations

import pytest
import torch

from policies.cpu_dtype import cpu_has_native_bf16
from policies.policy import SamplingParams
from policies.prefill import PromptPrefill
from policies.transformers_policy import TransformersPolicy
from tests.test_behaviour_logprobs import PROMPT, warped_logprobs

pytestmark = pytest.mark.slow


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path):
    flags = tmp_path / "cpuinfo"
    flags.write_text("flags\t: fpu sse2 avx2 fma\n")
    assert not cpu_has_native_bf16(flags)
    flags.write_text("flags\t: fpu avx2 avx512f avx512_bf16\n")
    assert cpu_has_native_bf16(flags)
    assert cpu_has_native_bf16(tmp_path / "absent")  # unknown platforms keep the model's own dtype


def test_a_bf16_model_on_a_slow_cpu_gets_a_twin_and_its_logprobs_stay_those_sampled(tiny_model_dir):
    policy = TransformersPolicy.load(str(tiny_model_dir))
    policy.model = policy.model.to(torch.bfloat16)
    policy.prefill = PromptPrefill(use_float32_twin=True)
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=40, seed=3)
    group = policy.generate(PROMPT, params, 3)
    twin = policy.prefill.twin
    assert next(twin.parameters()).dtype == torch.float32
    prompt_ids = policy.tokenizer(policy.render(PROMPT), add_special_tokens=False).input_ids
    for g in group:
        assert g.token_ids and len(g.logprobs) == len(g.token_ids)
        # recomputed with a float32 copy: the bf16 decode differs from it by bf16 rounding, not by a wrong position
        # (a token at the edge of the top-p nucleus may fall outside it in float32: those few are left out)
        expected = warped_logprobs(twin, prompt_ids, g.token_ids, params)
        inside = expected.isfinite()
        assert float(inside.float().mean()) > 0.9
        assert float((torch.tensor(g.logprobs)[inside] - expected[inside]).abs().mean()) < 0.05
    policy.generate(PROMPT, params, 2)
    assert policy.prefill.twin is twin  # same weights, same twin
    with torch.no_grad():
        next(policy.model.parameters()).add_(1.0)
    policy.version += 1  # what publish() does after changing weights
    policy.generate(PROMPT, params, 2)
    fresh = policy.prefill.twin
    assert fresh is not twin
    assert torch.equal(next(fresh.parameters()), next(policy.model.parameters()).float())


def test_prefilled_sampling_matches_sampling_from_scratch(tiny_model_dir):
    """Same seed, same tokens: the cache continues the prompt exactly where a full pass would."""
    policy = TransformersPolicy.load(str(tiny_model_dir))
    params = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=30, seed=8)
    prefilled = policy.generate(PROMPT, params, 2)
    prompt_ids = policy.tokenizer(policy.render(PROMPT), add_special_tokens=False).input_ids
    torch.manual_seed(8)
    input_ids = torch.tensor([prompt_ids]).repeat(2, 1)
    with torch.no_grad():
        out = policy.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            do_sample=True,
            temperature=0.7,
            top_k=0,
            top_p=1.0,
            max_new_tokens=30,
            eos_token_id=policy.eos_ids,
            pad_token_id=policy.pad_id,
        )
    for i, g in enumerate(prefilled):
        assert g.token_ids == out[i, len(prompt_ids) :].tolist()[: len(g.token_ids)]
