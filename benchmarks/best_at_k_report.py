"""best@k's table and paired contrasts, from the results files `benchmarks.best_at_k` writes.

The trained policies are compared with the untrained one prompt by prompt (every policy answered the same prompts
with the same seeds), so a contrast is the mean of per-prompt differences with a 95% percentile bootstrap interval
over prompts, as the closed loop's report pairs its arms by (problem, seed). Each file holds one training: its
first problem is the one trained on, the other the held-out one. Given several files, the last lines pool the
trained problems' prompts (`best_at_k ...`) and the held-out measurements' prompts (`best_at_k_held_out ...`).

Usage: python -m benchmarks.best_at_k_report benchmarks/results/best_at_k/tour_heuristic.json [more.json ...]
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.best_at_k import POLICIES, Measured
from benchmarks.closed_loop_report import bootstrap

KIND = "analysis"
SMOKE_ARGS = ("benchmarks/results/best_at_k/tour_heuristic.json",)

PAIRS = (("grpo", "none"), ("vpo", "none"), ("vpo", "grpo"))


@dataclass(frozen=True)
class Trial:
    """Every policy's measurement of one problem's prompts, from one results file."""

    problem: str
    held_out: bool
    rows: dict[str, Measured]


def load(paths: list[Path]) -> list[Trial]:
    trials = []
    for path in paths:
        measured = [Measured(**row) for row in json.loads(path.read_text())]
        problems = list(dict.fromkeys(m.problem for m in measured))
        for problem in problems:
            rows = {m.policy: m for m in measured if m.problem == problem}
            trials.append(Trial(problem=problem, held_out=problem != problems[0], rows=rows))
    return trials


def pooled(trials: list[Trial]) -> Trial:
    """The trials' prompts as one set: a policy's gains concatenated, its counts summed (policies all trials have)."""
    names = [p for p in POLICIES if all(p in t.rows for t in trials)]
    rows = {
        name: Measured(
            policy=name,
            problem="+".join(t.problem for t in trials),
            gains=[g for t in trials for g in t.rows[name].gains],
            variants=sum(t.rows[name].variants for t in trials),
            new_valid=sum(t.rows[name].new_valid for t in trials),
            copies=sum(t.rows[name].copies for t in trials),
        )
        for name in names
    }
    return Trial(problem=rows[names[0]].problem if names else "", held_out=trials[0].held_out, rows=rows)


def contrast(arm: Measured, base: Measured, k: int) -> str:
    """`arm - base` of best@k over the prompts both answered, with its interval and how many prompts rose."""
    diffs = [a[k - 1] - b[k - 1] for a, b in zip(arm.gains, base.gains, strict=True)]
    mean, lo, hi = bootstrap(diffs)
    above = sum(d > 0 for d in diffs)
    return f"best@{k} {arm.policy}-{base.policy}={mean:+.4f} [{lo:+.4f}, {hi:+.4f}] ({above} of {len(diffs)} above 0)"


def table(trial: Trial) -> list[str]:
    rows = trial.rows
    label = "best_at_k_held_out" if trial.held_out else "best_at_k"
    k = max(len(g) for r in rows.values() for g in r.gains)
    lines = [f"{trial.problem} ({len(next(iter(rows.values())).gains)} prompts): policy best@1 best@{k} new copies"]
    for r in rows.values():
        lines.append(
            f"  {r.policy:5} {r.best_at(1):.4f} {r.best_at(k):.4f} {r.new_valid}/{r.variants} {r.copies}/{r.variants}"
        )
    pairs = [(arm, base) for arm, base in PAIRS if arm in rows and base in rows]
    lines += [f"  {contrast(rows[arm], rows[base], at)}" for arm, base in pairs for at in (1, k)]
    means = " ".join(f"{r.policy}={r.best_at(k):.4f}" for r in rows.values())
    return [*lines, f"{label} {means} k={k} problem={trial.problem}"]


def report(trials: list[Trial]) -> list[str]:
    lines = []
    for trial in trials:
        lines += table(trial)
    for held_out in (False, True):
        group = [t for t in trials if t.held_out == held_out]
        if len(group) > 1:
            lines += table(pooled(group))
    return lines


if __name__ == "__main__":
    files = [Path(p) for p in sys.argv[1:]]
    if not files or not all(f.is_file() for f in files):
        raise SystemExit("usage: python -m benchmarks.best_at_k_report RESULTS.json [MORE.json ...] (best_at_k --out)")
    lines = report(load(files))
    print("\n".join(lines))
    print(f"best_at_k_report files={len(files)} tables={sum(line.startswith('best_at_k') for line in lines)}")
