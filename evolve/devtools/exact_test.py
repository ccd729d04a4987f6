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


MAX_PAIRS = 20  # 2^20 flips: a few seconds and some 400 MB


def sign_flip_p(differences: list[float]) -> float:
    """Two-sided exact paired test: the share of the 2^n sign flips of the paired `differences` (after - before,
    one per independent unit: a seed, or a problem under one seed) whose mean is at least as far from 0 as the one
    observed. With n units the smallest p is 2 / 2^n (3 seeds: 0.25; 9 problem-seed units: 0.004)."""
    if not differences:
        raise ValueError("the paired test needs at least one pair")
    if len(differences) > MAX_PAIRS:
        raise ValueError(f"{len(differences)} pairs: the exact test enumerates 2^n flips; give at most {MAX_PAIRS}")
    values = np.array(differences, dtype=float)
    observed = abs(values.mean())
    signs = np.array(list(itertools.product((1.0, -1.0), repeat=len(values))))
    return float(np.mean(np.abs((signs * values).mean(axis=1)) >= observed * (1 - 1e-9)))  # relative: tiny values too
