"""The shared-prompt forward (policies/shared_prompt.py) against each prompt + completion run alone: the same
logprobs and the same gradients, in float32, on a tiny model with a random LoRA adapter, in one completion pass
and in several after the prompt's one pass."""

from __future__ import annotations

import pytest
import torch

from policies.shared_prompt import completion_logprobs, completions_after, run_prompt
from policies.tiny import tiny_model, tiny_tokenizer
from policies.trainer import PolicyTrainer, TrainConfig
from tests.helpers import RAGGED_COMPLETIONS, randomise_lora_b

PROMPT = [11, 42, 7, 99, 3, 250, 18, 64, 5]
COMPLETIONS = RAGGED_COMPLETIONS
TEMPERATURE = 0.7


@pytest.fixture(scope="module", params=[None, 4], ids=["full-attention", "sliding-window"])
def model(request):
    """With a window of 4, the prompt's cache keeps its last 3 keys in the second layer: a pass must continue that
    layer as the model's own cache would (the cache built afresh from the keys alone failed there)."""
    tok = tiny_tokenizer()
    tiny = tiny_model(tok, seed=3, sliding_window=request.param)
    trainer = PolicyTrainer(tiny, tok, lambda p: p, TrainConfig(lora_rank=4, lora_alpha=8))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # a trained-looking adapter: LoRA's B starts at zero, which would hide its gradients
        for name, p in trainer.model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    trainer.model.float()
    return trainer.model


def alone(model, completion: list[int]) -> torch.Tensor:
    """The reference: prompt + completion in one sequence, logits over the completion's positions."""
    ids = torch.tensor([PROMPT + completion])
    logits = model(input_ids=ids).logits[0, len(PROMPT) - 1 : -1].float()
    logp = torch.log_softmax(logits / TEMPERATURE, dim=-1)
    return logp.gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def gradients(model, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def test_shared_prompt_logprobs_and_gradients_equal_each_sequence_alone(model):
    weights = [1.5, -0.5, 2.0, -1.0]  # an advantage per completion, as the PPO loss weighs them
    shared = completion_logprobs(model, PROMPT, COMPLETIONS, TEMPERATURE)
    reference = [alone(model, c) for c in COMPLETIONS]
    assert [len(s) for s in shared] == [len(c) for c in COMPLETIONS]
    for got, want in zip(shared, reference, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    got_grads = gradients(model, sum(w * s.sum() for w, s in zip(weights, shared, strict=True)))
    want_grads = gradients(model, sum(w * r.sum() for w, r in zip(weights, reference, strict=True)))
    assert got_grads.keys() == want_grads.keys() and got_grads
    assert any(g.abs().sum() > 0 for g in want_grads.values())  # the comparison has something to compare
    for name, want in want_grads.items():
        torch.testing.assert_close(got_grads[name], want, rtol=1e-4, atol=1e-5)


def test_several_completion_passes_after_one_prompt_pass_give_each_sequence_alones_gradients(model):
    """A group past the token budget runs its completions in several passes, each with its own backward, and its
    prompt once: the passes' gradients on the prompt's keys, values and last state are summed and carried back
    through the prompt's pass at the end. Leaving that last step out loses the adapter's gradient through the
    prompt, and this comparison fails."""
    weights = [1.5, -0.5, 2.0, -1.0]
    reference = [alone(model, c) for c in COMPLETIONS]
    want_grads = gradients(model, sum(w * r.sum() for w, r in zip(weights, reference, strict=True)))
    model.zero_grad()
    prompt = run_prompt(model, PROMPT, split=True)
    for part in ([0, 2], [1], [3]):
        got = completions_after(model, prompt, [COMPLETIONS[i] for i in part], TEMPERATURE)
        for i, logprobs in zip(part, got, strict=True):
            torch.testing.assert_close(logprobs, reference[i].detach(), rtol=1e-5, atol=1e-5)
        sum(weights[i] * logprobs.sum() for i, logprobs in zip(part, got, strict=True)).backward()
    prompt.backward()
    got_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    for name, want in want_grads.items():
        torch.testing.assert_close(got_grads[name], want, rtol=1e-4, atol=1e-5)


MLP_ONLY = ("gate_proj", "up_proj", "down_proj")  # layer 0's keys and values then need no gradient


@pytest.mark.parametrize(
    ("kl_coef", "targets"),
    [(0.0, TrainConfig.target_modules), (0.5, TrainConfig.target_modules), (0.0, MLP_ONLY)],
    ids=["no-kl", "kl", "mlp-only-lora"],
)
def test_an_update_runs_each_prompt_once_and_moves_the_adapter_as_one_pass_would(monkeypatch, kl_coef, targets):
    """The trainer splits a group past PASS_TOKENS into passes without running its prompt again, and the gradient
    its optimizer step takes is that of one pass over the whole group (compared before AdamW, whose step
    divides by the gradient's own size and so magnifies rounding in the near-zero entries). With a KL term, its
    reference (the adapter off) is the same prompt's one pass too, and the KL the update reports is the k3
    estimate over every completion token, computed here by hand. The prompt's passes are counted at the decoder:
    the calls without a cache to continue."""
    import numpy as np

    import policies.trainer as trainer_module
    from policies.training_groups import TrainingCompletion, TrainingGroup

    def trained(pass_tokens: int) -> tuple[dict[str, torch.Tensor], int]:  # the gradients; the prompt's passes
        monkeypatch.setattr(trainer_module, "PASS_TOKENS", pass_tokens)
        tok = tiny_tokenizer()
        torch.manual_seed(5)  # the adapter's initial weights
        config = TrainConfig(
            lora_rank=4,
            lora_alpha=8,
            learning_rate=1e-2,
            skip_zero_advantage=False,
            kl_coef=kl_coef,
            target_modules=targets,
        )
        trainer = PolicyTrainer(tiny_model(tok, seed=3), tok, lambda p: p, config)
        runs: list[bool] = []
        decoder = trainer.model.get_base_model().model
        decoder.register_forward_hook(
            lambda _m, _a, kwargs, _o: runs.append(kwargs.get("cache") is None), with_kwargs=True
        )
        randomise_lora_b(trainer.model, seed=7, scale=0.05)  # the first step.s gradient then reaches A and the prompt
        completions = [
            TrainingCompletion(i, c, [-1.0] * len(c), TEMPERATURE, np.array([[float(i % 3)]]))
            for i, c in enumerate(COMPLETIONS)
        ]
        groups = [TrainingGroup(g, "abcdefgh"[g:], completions) for g in range(2)]
        ids = [tok(g.prompt, add_special_tokens=False).input_ids for g in groups]
        with torch.no_grad():
            on = [completion_logprobs(trainer.model, i, COMPLETIONS, TEMPERATURE) for i in ids]
            with trainer.model.disable_adapter():
                off = [completion_logprobs(trainer.model, i, COMPLETIONS, TEMPERATURE) for i in ids]
        runs.clear()
        stats = trainer.update(groups)
        assert stats.samples == 8 and stats.optimizer_steps == 1
        if kl_coef:
            pairs = [(r, n) for rs, ns in zip(off, on, strict=True) for r, n in zip(rs, ns, strict=True)]
            k3 = [torch.exp(r - n) - (r - n) - 1 for r, n in pairs]
            assert stats.kl == pytest.approx(float(sum(k.sum() for k in k3)) / stats.tokens, rel=1e-4) and stats.kl > 0
        grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        return grads, sum(runs)

    one_pass, one_pass_runs = trained(10_000)
    several, several_runs = trained(6)  # [5], [9], [1, 3]: three passes a group
    assert one_pass_runs == several_runs == 2 * (1 + (kl_coef > 0))  # once a group (and once with the adapter off)
    assert any(g.abs().sum() > 0 for g in one_pass.values())
    for name, want in one_pass.items():
        torch.testing.assert_close(several[name], want, rtol=1e-4, atol=1e-6)


def test_passes_keep_one_prompt_and_at_most_the_budget():
    """One pass held every completion's activations until its backward: a group of long completions (4 x 2,048
    tokens) held 24 GB and was OOM-killed. Samples are grouped by prompt and temperature, and each prompt's
    completions split into passes of at most the budget's tokens (a longer completion alone)."""
    from policies.trainer import Sample, by_prompt, passes

    def sample(group: int, tokens: int, temperature: float = 0.8) -> Sample:
        return Sample([1, 2], [3] * tokens, [-1.0] * tokens, temperature, 0.5, group=group)

    samples = [sample(0, 600), sample(1, 10), sample(0, 600), sample(0, 300), sample(0, 2000), sample(0, 5, 1.2)]
    same_prompt = by_prompt(samples)
    assert [[len(s.completion_ids) for s in same] for same in same_prompt] == [[600, 600, 300, 2000], [10], [5]]
    sizes = [[len(s.completion_ids) for s in part] for part in passes(same_prompt[0], budget=1024)]
    assert sizes == [[600], [600, 300], [2000]]


def test_head_logprobs_match_autograd_across_chunks(monkeypatch):
    """The logprobs and row gradients computed in the forward pass (policies/head_logprobs.py) equal autograd's
    through log_softmax, in float64, with rows spanning several chunks."""
    import policies.head_logprobs as head_logprobs

    monkeypatch.setattr(head_logprobs, "CHUNK_ROWS", 4)
    generator = torch.Generator().manual_seed(1)
    weight = torch.randn(50, 8, generator=generator, dtype=torch.float64)
    rows = torch.randn(11, 8, generator=generator, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (11,), generator=generator)
    upstream = torch.randn(11, generator=generator, dtype=torch.float64)
    got = head_logprobs.token_logprobs(rows, weight, targets, 0.7)
    (got_grad,) = torch.autograd.grad((got * upstream).sum(), rows)
    want = torch.log_softmax(rows @ weight.T / 0.7, dim=-1).gather(1, targets[:, None]).squeeze(1)
    (want_grad,) = torch.autograd.grad((want * upstream).sum(), rows)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)


def test_a_pass_keeps_no_logits_for_its_backward(model):
    """What autograd saves for the backward pass of a group holds no [tokens, vocabulary] tensor: the logits and
    their log-softmax were most of an update's memory (about 2.5 MB a token with a 150k vocabulary)."""
    vocabulary = model.get_base_model().get_output_embeddings().weight.shape[0]
    tokens = len(PROMPT) + sum(len(c) for c in COMPLETIONS)
    widest: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.dim() >= 2 and t.shape[-1] == vocabulary and t.numel() >= len(COMPLETIONS[1]) * vocabulary:
            widest.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        shared = completion_logprobs(model, PROMPT, COMPLETIONS, TEMPERATURE)
    assert sum(s.sum() for s in shared).requires_grad
    assert widest == [], f"logits saved for backward: {widest} elements ({tokens} tokens x {vocabulary})"
