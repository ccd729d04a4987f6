"""Server-side aggregation: turn a run's rows into the small arrays the views draw.

The page never receives one point per program. Progress curves keep only the points where a best improved;
the Pareto view gets each pair's front plus a fixed-size sample; time series are bucketed; grids are cells.
So the page's size depends on the search's shape, not on the archive's length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from evolve.archive import RunRecord
from evolve.archive.report_reads import VersionRow
from evolve.problem.config import ComponentSpec, FitnessSection, SearchSection
from evolve.selection.population import FeatureSpace

PARETO_SAMPLE = 2000  # background points in the Pareto view
PARETO_AXES = 12  # fronts are precomputed for every pair among the first this-many axes
TIME_BUCKETS = 60
STAT_KEYS = ("loss", "clip_fraction", "kl", "set_reward_mean", "set_reward_std", "reward_diversity")


def run_components(run: RunRecord) -> list[ComponentSpec]:
    return list(FitnessSection.model_validate(run.config["problem"]["fitness"]).resolved())


def run_search(run: RunRecord) -> SearchSection:
    return SearchSection.model_validate(run.config["problem"].get("search", {}))


def seconds_since(start: datetime, times: np.ndarray) -> np.ndarray:
    return (times - np.datetime64(start, "us")) / np.timedelta64(1, "s")


@dataclass
class Steps:
    """A step curve: the points where a running best improved, plus the last point (to draw the flat tail)."""

    x_eval: list[int] = field(default_factory=list)
    x_time: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)


def running_best(values: np.ndarray, mask: np.ndarray, ids: np.ndarray, t: np.ndarray, sign: float = 1.0) -> Steps:
    """Improvement points of max(sign * value) over the rows in `mask` (NaN rows never improve)."""
    out = Steps()
    idx = np.flatnonzero(mask & ~np.isnan(values))
    if idx.size == 0:
        return out
    oriented = sign * values[idx]
    acc = np.maximum.accumulate(oriented)
    keep = np.ones(idx.size, dtype=bool)
    keep[1:] = acc[1:] > acc[:-1]
    chosen = idx[keep]
    last_row = np.flatnonzero(mask)[-1]
    out.x_eval = [int(i) + 1 for i in chosen] + [int(last_row) + 1]
    out.x_time = [float(t[i]) for i in chosen] + [float(t[last_row])]
    out.y = [float(sign * v) for v in acc[keep]] + [float(sign * acc[-1])]
    out.ids = [int(ids[i]) for i in chosen] + [int(ids[chosen[-1]])]
    return out


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points not dominated when both axes are maximised (ties keep one point)."""
    order = np.lexsort((-y, -x))
    ys = y[order]
    before = np.concatenate(([-np.inf], np.maximum.accumulate(ys)[:-1]))
    return order[ys > before]


@dataclass
class Views:
    """Everything the page draws, as plain lists; `figures.py` turns it into plotly figures."""

    meta: dict[str, Any]
    progress: dict[str, Steps]  # "all" and "island N": best scalar
    components: dict[str, Steps]  # component name: its best (in its own direction)
    island_components: dict[str, dict[str, Steps]]  # "island N": the same within that island
    pareto: dict[str, Any]
    grids: list[dict[str, Any]]
    errors: dict[str, Any]
    parse: dict[str, Any]
    throughput: dict[str, Any]
    versions: list[dict[str, Any]]
    lineage_roots: list[int]


def pareto_view(ids: np.ndarray, scalar: np.ndarray, matrix: np.ndarray, specs: list[ComponentSpec]) -> dict[str, Any]:
    axes = ["scalar", *[c.name for c in specs]][:PARETO_AXES]
    signs = [1.0, *[c.sign for c in specs]][:PARETO_AXES]
    values = np.column_stack([scalar, matrix])[:, : len(axes)]
    ok = ~np.isnan(values).any(axis=1)
    ids, values = ids[ok], values[ok]
    rng = np.random.default_rng(0)
    pick = np.sort(rng.choice(len(ids), size=min(PARETO_SAMPLE, len(ids)), replace=False)) if len(ids) else []
    # Fronts only depend on distinct vectors: dedupe first (the earliest program keeps each vector).
    if len(ids):
        values_u, first = np.unique(values, axis=0, return_index=True)
        ids_u = ids[first]
    else:
        values_u, ids_u = values, ids
    fronts: dict[str, list[list[float]]] = {}
    for i in range(len(axes)):
        for j in range(i + 1, len(axes)):
            front = pareto_front(signs[i] * values_u[:, i], signs[j] * values_u[:, j]) if len(ids_u) else []
            front = sorted(front, key=lambda k: values_u[k, i])
            fronts[f"{i},{j}"] = [[float(values_u[k, i]), float(values_u[k, j]), int(ids_u[k])] for k in front]
    return {
        "axes": axes,
        "sample": [[int(ids[k]), *map(float, values[k])] for k in pick],
        "fronts": fronts,
        "evaluated": len(ids),
    }


def grid_views(
    ids: np.ndarray,
    islands: np.ndarray,
    scalar: np.ndarray,
    matrix: np.ndarray,
    code_length: np.ndarray,
    run: RunRecord,
    specs: list[ComponentSpec],
) -> list[dict[str, Any]]:
    """Each island's MAP-Elites grid: the best scalar per cell among the programs made on that island.

    Cells come from the loop's own FeatureSpace (vectorised); migrant copies are not replayed, so a cell
    a migrant holds in the running loop shows its best native program here instead.
    """
    search = run_search(run)
    space = FeatureSpace(search.features, specs)
    ok = ~np.isnan(scalar)
    if not ok.any():
        return []
    fail = np.array([c.failure for c in specs], dtype=float)
    signs = np.array([c.sign for c in specs], dtype=float)
    oriented = signs * np.where(np.isnan(matrix), fail, matrix)
    cells = space.cells(code_length[ok], scalar[ok], oriented[ok])
    if cells.shape[1] == 1:
        cells = np.column_stack([cells, np.zeros(len(cells), dtype=int)])
    names = list(search.features)
    out = []
    for island in sorted(set(islands[ok].tolist())):
        mine = islands[ok] == island
        c, values, who = cells[mine][:, :2], scalar[ok][mine], ids[ok][mine]
        x0, y0 = c.min(axis=0)
        width, height = c.max(axis=0) - (x0, y0) + 1
        z = np.full((height, width), np.nan)
        holder = np.zeros((height, width), dtype=np.int64)
        order = np.lexsort((-who, values))  # ascending scalar, ties to the earliest: the last write wins
        z[c[order, 1] - y0, c[order, 0] - x0] = values[order]
        holder[c[order, 1] - y0, c[order, 0] - x0] = who[order]
        filled = ~np.isnan(z)
        out.append(
            {
                "island": island,
                "x_name": names[0],
                "y_name": names[1] if len(names) > 1 else "",
                "x": list(range(int(x0), int(x0 + width))),
                "y": list(range(int(y0), int(y0 + height))),
                "z": [
                    [None if not f else float(v) for v, f in zip(zr, fr, strict=True)]
                    for zr, fr in zip(z, filled, strict=True)
                ],
                "ids": [
                    [int(h) if f else None for h, f in zip(hr, fr, strict=True)]
                    for hr, fr in zip(holder, filled, strict=True)
                ],
                "elites": int(filled.sum()),
            }
        )
    return out


def buckets(t_end: float) -> np.ndarray:
    return np.linspace(0.0, max(t_end, 1.0), TIME_BUCKETS + 1)


def count_by(labels: list[str], t: np.ndarray, edges: np.ndarray) -> dict[str, list[int]]:
    column = np.array(labels, dtype=object)
    return {label: np.histogram(t[column == label], bins=edges)[0].tolist() for label in sorted(set(labels))}


def spread(edges: np.ndarray, start: np.ndarray, end: np.ndarray, amounts: np.ndarray) -> np.ndarray:
    """Each amount spread evenly over its interval [start, end] (seconds), summed per bucket of `edges`; an
    interval of no length puts its amount in the bucket of its instant. Why: a group's tokens are stored at its
    end but were sampled over its minutes; binned at the end, a 3 tok/s group shows as a spike of 170 tok/s."""
    totals = np.zeros(len(edges) - 1)
    point = ~(end > start)
    totals += np.histogram(end[point], bins=edges, weights=amounts[point])[0]
    lo, hi, amount = start[~point], end[~point], amounts[~point]
    if len(amount):  # the spread amounts' running total at each edge, differenced into buckets
        rate = amount / (hi - lo)
        totals += np.diff(_ramp_sum(edges, lo, rate) - _ramp_sum(edges, hi, rate))
    return totals


def _ramp_sum(edges: np.ndarray, at: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """Σ rate·(e − at) over the ramps that began before each edge e: O((n + buckets) log n), where a
    completions × buckets matrix would take gigabytes at a million completions."""
    order = np.argsort(at)
    at, rate = at[order], rate[order]
    rates = np.concatenate([[0.0], np.cumsum(rate)])
    moments = np.concatenate([[0.0], np.cumsum(rate * at)])
    k = np.searchsorted(at, edges, side="left")
    return edges * rates[k] - moments[k]


def throughput_view(
    edges: np.ndarray,
    eval_t: np.ndarray,
    tokens_span: tuple[np.ndarray, np.ndarray],
    tokens: np.ndarray,
    valid_t: np.ndarray,
) -> dict[str, Any]:
    """`tokens_span`: when each completion's group began and ended sampling (seconds since the run's start)."""
    width = float(edges[1] - edges[0])
    toks = spread(edges, tokens_span[0], tokens_span[1], tokens)
    evals = np.histogram(eval_t, bins=edges)[0]
    valid = np.histogram(valid_t, bins=edges)[0]
    per_k = np.where(toks > 0, 1000.0 * valid / np.maximum(toks, 1), np.nan)
    return {
        "t": ((edges[:-1] + edges[1:]) / 2).tolist(),
        "tokens_per_s": (toks / width).tolist(),
        "evals_per_min": (evals * 60.0 / width).tolist(),
        "valid_per_1k_tokens": [None if np.isnan(v) else float(v) for v in per_k],
        "tokens_total": int(toks.sum()),
        "has_tokens": bool(toks.sum() > 0),
    }


def version_view(versions: list[VersionRow], start: datetime) -> list[dict[str, Any]]:
    out = []
    for v in versions:
        stats = v.stats or {}
        out.append(
            {
                "number": v.number,
                "t": (v.created_at - start).total_seconds(),
                "best_child": v.best_child,
                "children": v.children,
                **{k: stats.get(k) for k in STAT_KEYS},
            }
        )
    return out
