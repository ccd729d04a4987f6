"""Drawing one token from a row of logits in numpy, and the exact logprob of the distribution it came from.

A backend that hands us raw logits (llama.cpp) is sampled here rather than by its own sampler chain, so that
each stored logprob is that of the distribution the token was actually drawn from: after temperature, top-k
and top-p, in that order (transformers' warpers and vLLM apply them in the same order). The trainer divides by
these numbers (the behaviour policy of its truncated importance weight), so they must be exact, not a second
forward pass's approximation.

A full sort of a 152k-entry vocabulary costs ~10 ms, more than a decoding step of a small model. The nucleus
is almost always a few hundred tokens at most, so it is searched among the largest `CANDIDATES` probabilities
first (a linear-time partition) and the whole vocabulary is sorted only when those do not reach `top_p`. Both
paths keep exactly the same set.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from policies.policy import SamplingParams

CANDIDATES = 512  # the largest probabilities searched for the nucleus before falling back to a full sort


def _descending(probs: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries, largest first (ties broken by index, as a stable sort would)."""
    if k >= probs.shape[0]:
        return np.argsort(-probs, kind="stable")
    part = np.argpartition(-probs, k - 1)[:k]
    return part[np.lexsort((part, -probs[part]))]


def warped_distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The token ids allowed after temperature, top-k and top-p, and their renormalised probabilities.

    Top-p keeps the smallest prefix of the tokens sorted by probability whose mass reaches `top_p` (a token
    is kept when the mass strictly before it is below `top_p`); at least one token is always kept.
    """
    scaled = logits.astype(np.float64) / max(params.temperature, 1e-5)
    scaled -= scaled.max()
    probs = np.exp(scaled)
    probs /= probs.sum()
    vocab = probs.shape[0]
    limit = min(params.top_k, vocab) if params.top_k > 0 else vocab
    if params.top_p >= 1.0:
        ids = _descending(probs, limit) if limit < vocab else np.arange(vocab)
    else:
        # top-k renormalises over its k tokens before top-p measures their mass
        total = 1.0 if limit >= vocab else float(-np.partition(-probs, limit - 1)[:limit].sum())
        ids = _descending(probs, min(CANDIDATES, limit))
        if probs[ids].sum() / total < params.top_p and ids.shape[0] < limit:
            ids = _descending(probs, limit)
        mass = probs[ids] / total
        before = np.cumsum(mass) - mass
        ids = ids[: max(1, int(np.count_nonzero(before < params.top_p)))]
    kept = probs[ids]
    return ids, kept / kept.sum()


Allowed = Callable[[np.ndarray], np.ndarray]  # token ids -> a boolean per id: may it come next?


def constrained_distribution(
    logits: np.ndarray, params: SamplingParams, allowed: Allowed
) -> tuple[np.ndarray, np.ndarray] | None:
    """The warped distribution held to a grammar: its allowed ids and their probabilities; None when the grammar
    allows no token at all.

    Truncate, then constrain: the warped distribution (temperature, top-k, top-p) restricted to the tokens the
    grammar allows and renormalised, p(t) / p(A). Only the warped distribution's support (the nucleus, mostly
    tens of tokens) is judged, which costs ~0.2 ms a row, where judging all 152k tokens costs 20-45 ms (more than
    the model's decoding step of the whole group). When the grammar allows none of the nucleus (or only tokens
    of no probability: at temperature 0 with top-p 1 the support is the whole vocabulary, all of it but one token
    at 0), the grammar masks the whole vocabulary and temperature, top-k and top-p are applied among the allowed
    tokens only.

    Both cases are fixed functions of the logits and the grammar's state, and the normaliser p(A) is summed over
    every allowed token of the support, so the probabilities returned are exactly those the token is drawn from.
    The lazy trick (draw unmasked, check only the drawn token, mask and redraw on a miss) draws from the same
    p(t) / p(A), but cannot say what p(A) is without judging the support anyway; and masking the whole
    vocabulary first, then warping, would need the full mask at every token.
    """
    ids, probs = warped_distribution(logits, params)
    ok = allowed(ids)
    kept = probs[ok]
    if kept.sum() > 0:  # an allowed token of the support with no mass (greedy keeps one token's) does not count
        return ids[ok], kept / kept.sum()
    every = np.flatnonzero(allowed(np.arange(logits.shape[0])))
    if not every.size:
        return None
    sub, probs = warped_distribution(logits[every], params)
    return every[sub], probs


class TokenSampler:
    """Draws tokens for the rows of one group from a seeded generator; one per `generate` call."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def draw(self, logits: np.ndarray) -> tuple[int, float]:
        """One token and the log of its probability under the distribution it was drawn from."""
        return self._pick(*warped_distribution(logits, self.params))

    def draw_held(self, logits: np.ndarray, allowed: Allowed) -> tuple[int, float] | None:
        """As `draw`, among the tokens `allowed` says may come next (`constrained_distribution`); None when the
        grammar allows no token at all."""
        held = constrained_distribution(logits, self.params, allowed)
        return None if held is None else self._pick(*held)

    def _pick(self, ids: np.ndarray, probs: np.ndarray) -> tuple[int, float]:
        pick = int(np.searchsorted(np.cumsum(probs), self.rng.random() * probs.sum(), side="right"))
        pick = min(pick, ids.shape[0] - 1)
        return int(ids[pick]), float(np.log(probs[pick]))
