"""Training groups: each prompt's G completions, each with its m answers' reward vectors.

Rewards are oriented (larger is better) and normalised per component to [0, 1] by the bounds the problem
declares, or else by the range observed among the answers of the batch being trained on (the recent groups,
so the cost of an update does not grow with the archive). Unparseable, failed and duplicate answers are zero
rows; every answer that gave no new valid program is also marked `wasted`, for the optional penalty
(policies/shaping.py). Each group also carries its parent's vector on the same scale and, per answer, whether the
child scored exactly as its parent did (`unchanged`): the reward for improvement (policies/shaping.py) pays each
answer its gain over that parent and treats a child that behaves as its parent (a docstring edit) as wasted.
The engine reads these groups out of its archive (`evolve.training.load_batch`); this module knows no archive,
so the policies package stays independent of the engine.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class TrainingCompletion:
    completion_id: int
    token_ids: list[int]
    logprobs: list[float]
    temperature: float
    answers: np.ndarray  # (m, D) oriented raw scores; NaN rows for zero answers until normalised
    # (m,) True where the answer gave no new valid program: it echoed the parent, repeated a known program, did
    # not parse, was missing or failed (policies/shaping.py penalises them when asked); None: none was wasted.
    wasted: np.ndarray | None = None
    # (m,) True where a valid child's oriented score vector equals its parent's exactly: a new program (a
    # docstring or a renamed local) with its parent's behaviour. Not wasted for the older shapings; None: none.
    unchanged: np.ndarray | None = None


@dataclass
class TrainingGroup:
    prompt_id: int
    prompt: str
    completions: list[TrainingCompletion]
    # (D,) the parent's oriented scores, on the answers' scale once normalised (not clipped: an observed range
    # may not span it); None where the parent has no valid evaluation.
    parent: np.ndarray | None = None

    def rewards(self) -> np.ndarray:
        return np.stack([c.answers for c in self.completions])

    def wasted(self) -> np.ndarray:
        """(G, m) mask of the answers that gave no new valid program."""
        m = self.completions[0].answers.shape[0] if self.completions else 0
        return np.stack([np.zeros(m, bool) if c.wasted is None else c.wasted for c in self.completions])

    def unchanged(self) -> np.ndarray:
        """(G, m) mask of the valid answers whose child scored exactly as the parent."""
        m = self.completions[0].answers.shape[0] if self.completions else 0
        return np.stack([np.zeros(m, bool) if c.unchanged is None else c.unchanged for c in self.completions])


@dataclass
class Batch:
    groups: list[TrainingGroup] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


def normalise(groups: list[TrainingGroup], bounds: Sequence[tuple[float, float] | None]) -> None:
    """Map every answer row into [0, 1] per component in place; zero answers (NaN rows) become 0.

    `bounds[d]` is component d's declared (low, high) in oriented space, or None to use the observed range (of
    the answers alone, as before parents were carried). Each group's parent goes through the same map, unclipped.
    """
    width = len(bounds)
    rows = np.concatenate([g.rewards().reshape(-1, width) for g in groups]) if groups else np.zeros((0, 0))
    valid = rows[~np.isnan(rows).any(axis=1)] if rows.size else rows
    lo = np.array([b[0] if b else np.nan for b in bounds])
    hi = np.array([b[1] if b else np.nan for b in bounds])
    if len(valid):
        lo = np.where(np.isnan(lo), valid.min(axis=0), lo)
        hi = np.where(np.isnan(hi), valid.max(axis=0), hi)
    span = np.where(hi > lo, hi - lo, 1.0)
    for g in groups:
        if g.parent is not None:
            g.parent = (g.parent - lo) / span
        for c in g.completions:
            unit = np.clip((c.answers - lo) / span, 0.0, 1.0)
            c.answers = np.nan_to_num(unit, nan=0.0)
