"""The logprob of each target token from the decoder's last hidden states, without keeping the logits.

Autograd through `log_softmax(head(rows))` keeps the [tokens, vocabulary] logits and their log-softmax for the
backward pass: with a 150k-token vocabulary that is about 2.5 MB a token, most of an update's memory (a group of
2,000 completion tokens held 5 GB of it). But each output is one scalar per row, and the head is not trained, so
the gradient with respect to a row is known in the forward pass already: d logp(y)/d row = (onehot(y) - p) W / T.
This computes it there, chunk by chunk, and keeps only that [tokens, hidden] matrix; the backward pass is a
multiplication. The arithmetic is the same as autograd's (one more product of the probabilities with W, which
autograd also does in its backward), and nothing is recomputed.
"""

from __future__ import annotations

from typing import Any

CHUNK_ROWS = 256  # rows whose logits exist at once: 256 x 150k floats = 150 MB


def token_logprobs(rows: Any, weight: Any, targets: Any, temperature: float) -> Any:
    """logprob of `targets[i]` under softmax(rows[i] @ weight.T / temperature), as a 1-D float32 tensor that is
    differentiable with respect to `rows` (the head `weight` is taken as frozen)."""
    return _HeadLogprobs.apply(rows, weight, targets, max(float(temperature), 1e-5))


def _chunk(rows: Any, weight: Any, targets: Any, temperature: float, want_grad: bool) -> tuple[Any, Any]:
    import torch

    logits = (rows @ weight.T).float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(1, targets[:, None]).squeeze(1)
    if not want_grad:
        return picked, None
    coeff = logp.exp_().neg_()  # -p, in place over the log-probabilities it no longer needs
    coeff.scatter_add_(1, targets[:, None], torch.ones_like(picked[:, None]))  # onehot(y) - p
    return picked, (coeff.to(weight.dtype) @ weight).float() / temperature


class _HeadLogprobs:
    """A torch.autograd.Function, built on first use so that importing this module does not import torch."""

    _function: Any = None

    @classmethod
    def apply(cls, rows: Any, weight: Any, targets: Any, temperature: float) -> Any:
        if cls._function is None:
            cls._function = _build()
        return cls._function.apply(rows, weight, targets, temperature)


def _build() -> Any:
    import torch

    class HeadLogprobs(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, rows: Any, weight: Any, targets: Any, temperature: float) -> Any:
            if ctx.needs_input_grad[1]:
                raise ValueError("head_logprobs takes the output projection as frozen; this one is being trained")
            want_grad = bool(ctx.needs_input_grad[0])
            picked, grads = [], []
            for start in range(0, rows.shape[0], CHUNK_ROWS):
                end = start + CHUNK_ROWS
                value, grad = _chunk(rows[start:end], weight, targets[start:end], temperature, want_grad)
                picked.append(value)
                grads.append(grad)
            if want_grad:
                ctx.save_for_backward(torch.cat(grads) if grads else rows.new_zeros(rows.shape, dtype=torch.float32))
                ctx.rows_dtype = rows.dtype
            return torch.cat(picked) if picked else rows.new_zeros((0,), dtype=torch.float32)

        @staticmethod
        def backward(ctx: Any, grad_out: Any) -> Any:
            (row_grads,) = ctx.saved_tensors
            return (grad_out[:, None] * row_grads).to(ctx.rows_dtype), None, None, None

    return HeadLogprobs
