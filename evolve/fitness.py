"""Views of a named score vector: oriented (larger is better), normalised, and the default scalar.

The one home of orientation: every part that compares scores (selection, prompts, training rewards, the live
view, `inspect`) signs them here, fills a missing component with its fail value here, and reads bounds in
oriented form from here, so they all agree on which way is better.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from evolve.problem.config import ComponentSpec


def oriented(components: Sequence[ComponentSpec], scores: Mapping[str, float]) -> list[float]:
    """Each component signed so that larger is better; a missing component scores its fail value."""
    return [c.sign * float(scores.get(c.name, c.failure)) for c in components]


def oriented_array(components: Sequence[ComponentSpec], scores: Mapping[str, float]) -> np.ndarray:
    """`oriented` as a (D,) array, the form selection and training compute with."""
    return np.array(oriented(components, scores), dtype=float)


def raw_scores(components: Sequence[ComponentSpec], values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Undo `oriented`: the named scores as the evaluator reported them (the sign is its own inverse)."""
    return {c.name: c.sign * float(v) for c, v in zip(components, values, strict=True)}


def oriented_by_name(components: Sequence[ComponentSpec], values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """An oriented vector keyed by component name."""
    return {c.name: float(v) for c, v in zip(components, values, strict=True)}


def failure_scores(components: Sequence[ComponentSpec]) -> dict[str, float]:
    """The vector a failed program scores: every component at its fail value."""
    return {c.name: c.failure for c in components}


def signs(components: Sequence[ComponentSpec]) -> dict[str, float]:
    """+1 for a component to maximise, -1 for one to minimise."""
    return {c.name: c.sign for c in components}


def better(component: ComponentSpec, value: float, than: float) -> bool:
    """Whether `value` beats `than` in the component's own direction."""
    return component.sign * value > component.sign * than


def oriented_bounds(components: Sequence[ComponentSpec]) -> list[tuple[float, float] | None]:
    """Each component's declared bounds as (low, high) in oriented space; None where none are declared."""
    out: list[tuple[float, float] | None] = []
    for c in components:
        if c.bounds is None:
            out.append(None)
        else:
            a, b = c.sign * c.bounds[0], c.sign * c.bounds[1]
            out.append((min(a, b), max(a, b)))
    return out


def solved(components: Sequence[ComponentSpec], scores: Mapping[str, float]) -> bool:
    """Every component at its best declared bound, in its own direction (needs bounds on every component)."""
    bounds = oriented_bounds(components)
    if not components or any(b is None for b in bounds):
        return False
    return all(v >= b[1] for v, b in zip(oriented(components, scores), bounds, strict=True) if b is not None)


def scalar_bounds(components: Sequence[ComponentSpec]) -> tuple[float, float] | None:
    """Bounds of `scalar_view`, when every component declares bounds."""
    bounds = oriented_bounds(components)
    if not components or any(b is None for b in bounds):
        return None
    total = sum(c.weight for c in components) or 1.0
    lo = sum(c.weight * b[0] for c, b in zip(components, bounds, strict=True) if b is not None) / total
    hi = sum(c.weight * b[1] for c, b in zip(components, bounds, strict=True) if b is not None) / total
    return lo, hi


def scalar_view(components: Sequence[ComponentSpec], scores: Mapping[str, float]) -> float:
    """Weighted mean of the oriented components: the single number OpenEvolve-style tools would rank by."""
    total = sum(c.weight for c in components) or 1.0
    return sum(c.weight * v for c, v in zip(components, oriented(components, scores), strict=True)) / total


def score_text(value: float) -> str:
    """A score in six significant digits, or in twelve where six would round it onto a round number it is not: a
    best of 0.999999995 shown as "1" reads as solved beside a run that rightly did not stop as solved."""
    short = f"{value:.6g}"
    shown = float(short)
    if shown == value or shown != round(shown, 2):
        return short
    return f"{value:.12g}"
