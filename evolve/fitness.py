"""Views of a named score vector: oriented (larger is better), normalised, and the default scalar."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from evolve.problem.config import ComponentSpec


def oriented(components: Sequence[ComponentSpec], scores: Mapping[str, float]) -> list[float]:
    """Each component signed so that larger is better."""
    return [c.sign * float(scores.get(c.name, c.failure)) for c in components]


def scalar_view(components: Sequence[ComponentSpec], scores: Mapping[str, float]) -> float:
    """Weighted mean of the oriented components: the single number OpenEvolve-style tools would rank by."""
    total = sum(c.weight for c in components) or 1.0
    return sum(c.weight * v for c, v in zip(components, oriented(components, scores), strict=True)) / total
