"""The test across a handful of independent runs (seeds, trainings): exact, over every relabelling, because with
three runs an arm a bootstrap or a t-test claims a precision the data do not hold."""

from __future__ import annotations

import itertools

import numpy as np


def permutation_p(a: list[float], b: list[float]) -> float:
    """Two-sided exact permutation test of mean(a) - mean(b) over every split of the pooled values into groups of
    their sizes (with 3 against 3 the smallest p is 2/20 = 0.1)."""
    if not a or not b:
        raise ValueError("the exact test needs at least one value on each side")
    pooled, n = np.array(a + b, dtype=float), len(a)
    observed = abs(np.mean(a) - np.mean(b))
    splits = list(itertools.combinations(range(len(pooled)), n))
    hits = sum(abs(pooled[list(s)].mean() - np.delete(pooled, list(s)).mean()) >= observed - 1e-12 for s in splits)
    return hits / len(splits)
