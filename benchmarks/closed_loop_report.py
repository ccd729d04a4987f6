"""What `benchmarks/closed_loop.py --report` prints: the arms side by side, each (problem, seed) pair, and the paired
differences with their bootstrap intervals.

Why paired: the arms of one (problem, seed) share the seed program, the first group's draws and the problem's
difficulty, so the spread between problems (tour_heuristic's best/seed moves, minimizer's hardly does) cancels in
an arm's difference from another on the same pair, and an interval over those differences says what the seeds
say about training itself. Best/seed is the headline; new valid children per 1,000 tokens and the share of copies
are reported the same way because an update can change how the model spends its tokens before it changes the best.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from benchmarks.closed_loop_arm import ArmResult, ArmSettings

ARMS = ("none", "grpo", "vpo")
COLUMNS = ("best_ratio", "valid_per_1k_tokens", "copy_share", "diversity", "held_out_ratio", "groups", "updates")
PAIRED = {"best/seed": "best_ratio", "new valid /1k tok": "valid_per_1k_tokens", "copies": "copy_share"}
CONTRASTS = (("vpo", "none"), ("vpo", "grpo"), ("grpo", "none"))


def ms(values: list[float | None]) -> str:
    """Mean ± sample sd of the finite values, `n/a` when there are none."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    return "n/a" if not len(v) else f"{v.mean():.3f}±{v.std(ddof=1) if len(v) > 1 else 0.0:.3f}"


def bootstrap(diffs: list[float], draws: int = 10_000) -> tuple[float, float, float]:
    """Mean of paired differences and its 95% percentile bootstrap interval (resampling pairs)."""
    d = np.asarray(diffs, dtype=float)
    means = np.random.default_rng(0).choice(d, size=(draws, len(d)), replace=True).mean(axis=1)
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def paired(results: list[ArmResult], column: str, arm: str, other: str) -> list[float]:
    """`arm - other` of `column` over the (problem, seed) pairs where both arms finished."""
    pairs: dict[tuple[str, int], dict[str, float]] = {}
    for r in results:
        pairs.setdefault((r.problem, r.seed), {})[r.arm] = getattr(r, column)
    return [p[arm] - p[other] for p in pairs.values() if arm in p and other in p]


def contrast(results: list[ArmResult], column: str, arm: str, other: str) -> str:
    diffs = paired(results, column, arm, other)
    if not diffs:
        return ""
    mean, lo, hi = bootstrap(diffs)
    return f"{arm}-{other}={mean:+.3f} [{lo:+.3f}, {hi:+.3f}] (n={len(diffs)})"


def report(results: list[ArmResult], settings: ArmSettings) -> None:
    by_arm = {a: [r for r in results if r.arm == a] for a in ARMS}
    print(f"\nsettings {asdict(settings)}")
    print("arm   | best/seed | new valid /1k tok | copies | diversity | held-out best@k/seed | groups | updates")
    for arm, rows in by_arm.items():
        k = rows[0].held_out_k if rows else 0
        cells = [ms([getattr(r, c) for r in rows]) for c in COLUMNS]
        cells[4] += f" (k={k})"
        print(f"{arm:5} | " + " | ".join(cells))
    print("per (problem, seed): best/seed, new valid children, copies")
    for problem, seed in sorted({(r.problem, r.seed) for r in results}):
        cells = [
            f"{r.arm} {r.best_ratio:.3f} {r.new_valid} {r.copy_share:.0%}"
            for a in ARMS
            for r in results
            if (r.problem, r.seed, r.arm) == (problem, seed, a)
        ]
        print(f"  {problem} s{seed}: " + " | ".join(cells))
    print("best/seed after each group, and new valid children per group (means over problems x seeds):")
    for arm, rows in by_arm.items():
        if rows:
            width = min(len(r.curve) for r in rows)
            curve = np.mean([r.curve[:width] for r in rows], axis=0)
            valid = np.mean([r.valid_per_group[:width] for r in rows], axis=0)
            print(f"  {arm:5} best  " + " ".join(f"{v:.3f}" for v in curve))
            print(f"  {arm:5} valid " + " ".join(f"{v:.1f}" for v in valid))
    print("wall seconds per part (mean over runs):")
    for arm, rows in by_arm.items():
        keys = sorted({k for r in rows for k in r.seconds})
        print(f"  {arm:5} " + ", ".join(f"{k} {np.mean([r.seconds.get(k, 0.0) for r in rows]):.0f}" for k in keys))
    print("paired differences, mean [95% bootstrap interval over (problem, seed) pairs]:")
    for label, column in PAIRED.items():
        print(f"  {label:17} " + "  ".join(filter(None, (contrast(results, column, *c) for c in CONTRASTS))))
    line = "closed_loop " + " ".join(f"{a}={ms([r.best_ratio for r in by_arm[a]])}" for a in ARMS)
    line += f" groups={min((r.groups for r in results), default=0)} (best/seed, mean±sd over problems x seeds)"
    print(" ".join(filter(None, [line, *(contrast(results, "best_ratio", *c) for c in CONTRASTS[:2])])))
