"""Training groups: each prompt's G completions, each with its m answers' reward vectors.

Rewards are oriented (larger is better) and normalised per component to [0, 1] by the bounds the problem
declares, or else by the range observed among the answers of the batch being trained on (the recent groups,
so the cost of an update does not grow with the archive). Unparseable, failed and duplicate answers are zero
rows; every answer that gave no new valid program is also marked `wasted`, for the optional penalty
(policies/shaping.py).
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


@dataclass
class TrainingGroup:
    prompt_id: int
    prompt: str
    completions: list[TrainingCompletion]

    def rewards(self) -> np.ndarray:
        return np.stack([c.answers for c in self.completions])

    def wasted(self) -> np.ndarray:
        """(G, m) mask of the answers that gave no new valid program."""
        m = self.completions[0].answers.shape[0] if self.completions else 0
        return np.stack([np.zeros(m, bool) if c.wasted is None else c.wasted for c in self.completions])


@dataclass
class Batch:
    groups: list[TrainingGroup] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


def normalise(groups: list[TrainingGroup], bounds: Sequence[tuple[float, float] | None]) -> None:
    """Map every answer row into [0, 1] per component in place; zero answers (NaN rows) become 0.

    `bounds[d]` is component d's declared (low, high) in oriented space, or None to use the observed range.
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
        for c in g.completions:
            unit = np.clip((c.answers - lo) / span, 0.0, 1.0)
            c.answers = np.nan_to_num(unit, nan=0.0)
