"""Logprobs of several completions of one prompt, the prompt run once.

A group's G completions share one prompt of 800-1,400 tokens, and are themselves 200-400 tokens long: run once
per completion (and once more with the adapter off for the KL reference), the prompt was most of an update's
arithmetic. Here the prompt runs once; its keys and values (which depend on the adapter, so the gradient flows
back through them) are repeated for the G completions, which run as one right-padded batch. The vocabulary
projection is applied to each completion's real rows only (a [G, L, vocabulary] logits tensor of a 150k-token
vocabulary would hold about 0.7 GB for G=4, L=300), a chunk at a time, and its logits are not kept for the
backward pass (policies/head_logprobs.py).

The result equals running each prompt + completion alone (tests/test_shared_prompt.py checks logprobs and
gradients in float32), because a completion attends to the prompt's keys and values and to its own earlier
tokens only: padding sits after every real token, and the attention mask hides it from nothing that counts.
"""

from __future__ import annotations

from typing import Any

from policies.head_logprobs import token_logprobs


def _parts(model: Any) -> tuple[Any, Any]:
    """The decoder stack and the output projection, through a PEFT wrapper if there is one (LoRA adapts the
    stack's projections; the output projection is not adapted)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model, base.get_output_embeddings()


def completion_logprobs(
    model: Any, prompt_ids: list[int], completions: list[list[int]], temperature: float, device: Any = None
) -> list[Any]:
    """For each completion, the logprob of each of its tokens after the prompt and its own earlier tokens, at the
    sampling `temperature` (1-D tensors, differentiable when gradients are enabled)."""
    import torch

    if not completions:
        return []
    decoder, head = _parts(model)
    device = device or next(model.parameters()).device
    prompt = torch.tensor([prompt_ids], device=device)
    first = decoder(input_ids=prompt, use_cache=True)
    cache = first.past_key_values
    last_prompt_state = first.last_hidden_state[0, -1:]  # predicts each completion's first token
    lengths = [len(c) for c in completions]
    width = max(lengths)
    batch = torch.zeros((len(completions), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(completions), len(prompt_ids) + width), dtype=torch.long, device=device)
    mask[:, : len(prompt_ids)] = 1
    for i, tokens in enumerate(completions):
        batch[i, : len(tokens)] = torch.tensor(tokens, device=device)
        mask[i, len(prompt_ids) : len(prompt_ids) + len(tokens)] = 1
    cache.batch_repeat_interleave(len(completions))
    positions = torch.arange(len(prompt_ids), len(prompt_ids) + width, device=device).expand(len(completions), -1)
    states = decoder(input_ids=batch, attention_mask=mask, cache=cache, position_ids=positions)
    out = []
    for i, length in enumerate(lengths):
        rows = torch.cat([last_prompt_state, states.last_hidden_state[i, : length - 1]])
        out.append(_logprobs(head, rows, batch[i, :length], temperature))
    return out


def _logprobs(head: Any, rows: Any, targets: Any, temperature: float) -> Any:
    """The targets' logprobs; through `head_logprobs` (no logits kept for the backward pass) when the head is a
    frozen linear map without bias, as in every model this project trains, else plain autograd."""
    import torch

    if getattr(head, "bias", None) is None and not head.weight.requires_grad:
        return token_logprobs(rows, head.weight, targets, temperature)
    logp = torch.log_softmax(head(rows).float() / max(temperature, 1e-5), dim=-1)
    return logp.gather(1, targets[:, None]).squeeze(1)
