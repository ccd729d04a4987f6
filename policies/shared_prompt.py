"""Logprobs of several completions of one prompt, the prompt run once however many passes the completions take.

A group's G completions share one prompt of 800-1,400 tokens, and are themselves 200-400 tokens long: run once
per completion (and once more with the adapter off for the KL reference), the prompt was most of an update's
arithmetic. Here the prompt runs once (`run_prompt`); its keys and values (which depend on the adapter, so the
gradient flows back through them) are repeated for the completions, which run as right-padded batches
(`completions_after`). The vocabulary projection is applied to each completion's real rows only, a chunk at a
time, and its logits are not kept for the backward pass (policies/head_logprobs.py).

A group past the trainer's token budget takes several completion passes, each with its own backward (its
activations freed before the next pass). The prompt's pass is still run once: with `split=True` the passes read
detached copies of its keys, values and last hidden state, which gather the gradient of every pass, and
`SharedPrompt.backward` then carries that sum back through the prompt's one pass. Before, each pass ran the
prompt again: on this project's CI machine (AVX2, float32) `benchmarks.trainer_step --embedded` updated on a
roman_numerals group of 4 x 300 tokens in 119.9 s then, and in 90.6 s with the prompt run once.

The result equals running each prompt + completion alone (tests/test_shared_prompt.py checks logprobs and
gradients in float32, in one pass and in several), because a completion attends to the prompt's keys and values
and to its own earlier tokens only: padding sits after every real token, and the attention mask hides it from
nothing that counts.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from policies.head_logprobs import token_logprobs


@dataclass
class SharedPrompt:
    """A prompt's one pass: its cache, each layer's keys and values and the last hidden state (which predicts a
    completion's first token). With `split`, the keys, values and state are leaves that gather the completion
    passes' gradients, and `graph` holds the pass's own outputs for `backward`. The cache keeps each layer's kind
    (a sliding-window layer holds only its window's last keys), which a pass copies and fills with these keys."""

    length: int
    cache: Any
    keys: list[Any]
    values: list[Any]
    last_state: Any
    graph: list[Any] = field(default_factory=list)

    def cache_for(self, n: int) -> Any:
        """A cache for `n` completions at once: a copy of the prompt's, its keys and values repeated `n` times (a
        pass appends to its layers, which must leave this prompt's own untouched for the next pass)."""
        cache = copy.copy(self.cache)
        cache.layers = [copy.copy(layer) for layer in self.cache.layers]
        for layer, keys, values in zip(cache.layers, self.keys, self.values, strict=True):
            layer.keys, layer.values = keys, values
        cache.batch_repeat_interleave(n)
        return cache

    def backward(self) -> None:
        """Carry the gradients that the completion passes left on the leaves back through the prompt's pass (once,
        after the last completion pass). Without `split` the gradient already went through with each pass."""
        import torch

        if not self.graph:
            return
        leaves = [*self.keys, *self.values, self.last_state]
        pairs = [(out, leaf.grad) for out, leaf in zip(self.graph, leaves, strict=True) if leaf.grad is not None]
        if pairs:
            torch.autograd.backward([out for out, _ in pairs], [grad for _, grad in pairs])
        self.graph = []


def _parts(model: Any) -> tuple[Any, Any]:
    """The decoder stack and the output projection, through a PEFT wrapper if there is one (LoRA adapts the
    stack's projections; the output projection is not adapted)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model, base.get_output_embeddings()


def run_prompt(model: Any, prompt_ids: list[int], device: Any = None, *, split: bool = False) -> SharedPrompt:
    """Run the prompt once. `split`: the completions will take several passes, each with its own backward, so
    hand them leaves and keep this pass's graph for `SharedPrompt.backward`."""
    import torch

    decoder, _ = _parts(model)
    device = device or next(model.parameters()).device
    first = decoder(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True)
    cache = getattr(first, "cache", None)  # transformers 5's name for past_key_values
    cache = first.past_key_values if cache is None else cache
    keys, values = [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]
    last_state = first.last_hidden_state[0, -1:]
    prompt = SharedPrompt(len(prompt_ids), cache, keys, values, last_state)
    if split and torch.is_grad_enabled():
        prompt.graph = [*keys, *values, last_state]
        # A leaf asks for a gradient only where its tensor has one to pass on (a LoRA that leaves k_proj and
        # v_proj alone makes layer 0's keys and values constants).
        prompt.keys = [k.detach().requires_grad_(k.requires_grad) for k in keys]
        prompt.values = [v.detach().requires_grad_(v.requires_grad) for v in values]
        prompt.last_state = last_state.detach().requires_grad_(last_state.requires_grad)
    return prompt


def completions_after(
    model: Any, prompt: SharedPrompt, completions: list[list[int]], temperature: float, device: Any = None
) -> list[Any]:
    """For each completion, the logprob of each of its tokens after the prompt and its own earlier tokens, at the
    sampling `temperature` (1-D tensors, differentiable when gradients are enabled), in one batched pass."""
    import torch

    if not completions:
        return []
    decoder, head = _parts(model)
    device = device or next(model.parameters()).device
    n, width = len(completions), max(len(c) for c in completions)
    batch = torch.zeros((n, width), dtype=torch.long, device=device)
    mask = torch.zeros((n, prompt.length + width), dtype=torch.long, device=device)
    mask[:, : prompt.length] = 1
    for i, tokens in enumerate(completions):
        batch[i, : len(tokens)] = torch.tensor(tokens, device=device)
        mask[i, prompt.length : prompt.length + len(tokens)] = 1
    cache = prompt.cache_for(n)
    positions = torch.arange(prompt.length, prompt.length + width, device=device).expand(n, -1)
    states = decoder(input_ids=batch, attention_mask=mask, cache=cache, position_ids=positions)
    out = []
    for i, tokens in enumerate(completions):
        rows = torch.cat([prompt.last_state, states.last_hidden_state[i, : len(tokens) - 1]])
        out.append(_logprobs(head, rows, batch[i, : len(tokens)], temperature))
    return out


def completion_logprobs(
    model: Any, prompt_ids: list[int], completions: list[list[int]], temperature: float, device: Any = None
) -> list[Any]:
    """The prompt and all its completions in one pass each: `completions_after(run_prompt(...))`."""
    if not completions:
        return []
    return completions_after(model, run_prompt(model, prompt_ids, device), completions, temperature, device)


def _logprobs(head: Any, rows: Any, targets: Any, temperature: float) -> Any:
    """The targets' logprobs; through `head_logprobs` (no logits kept for the backward pass) when the head is a
    frozen linear map without bias, as in every model this project trains, else plain autograd."""
    import torch

    if getattr(head, "bias", None) is None and not head.weight.requires_grad:
        return token_logprobs(rows, head.weight, targets, temperature)
    logp = torch.log_softmax(head(rows).float() / max(temperature, 1e-5), dim=-1)
    return logp.gather(1, targets[:, None]).squeeze(1)
