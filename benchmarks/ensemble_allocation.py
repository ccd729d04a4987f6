"""An ensemble in one run: the bandit against uniform allocation and the best single member, at equal wall time.

The members are the embedded model at two temperatures and with two prompt templates (a 2 x 2 grid, one loaded
model shared by all four). Per problem and seed, each arm gets a fresh run of the same wall time (`--max-time`:
no group starts after it; the group being sampled finishes and queued children are still scored):
- `single:NAME`: one member alone (each member in turn; `best_single` is the best of them per problem and seed,
  an oracle choice that favours the single member);
- `uniform`: all members, taking turns;
- `bandit`: all members, shared by the Thompson-sampling bandit (evolve/bandit.py).
The ask is fixed (`asks = "base"`), so the arms differ only in who samples each group; the stall rule is off, so
only the time ends a run. Per problem: the best scalar's gain over the seed's, (best - seed) / |seed|, and new
valid children per 1,000 tokens. The last line is
`ensemble_allocation bandit=G±S uniform=G±S best_single=G±S improved=K/N`: the mean gain over problems (± its
spread over seeds), and on how many of the N problems the bandit's mean gain beat both uniform's and the best
single's.

Usage: python -m benchmarks.ensemble_allocation [--problems roman_numerals,durations] [--max-time 120] [--seeds 0,1]
       [--policy embedded] [--singles 0,1,2,3] [--group-size 2] [--max-new-tokens 256]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evolve.archive import Archive, summary_yield
from evolve.fitness import signs
from evolve.loop import SearchLoop, run_search
from evolve.members import MemberSpec
from evolve.options import RunOptions
from evolve.problem import load_problem
from evolve.runs import open_run
from evolve.yields import worst_values
from policies.from_spec import make_policy
from policies.policy import Policy
from sandboxes.backends import make_sandbox

KIND = "experiment"
SMOKE_ARGS = (  # a run of seconds (python -m benchmarks --smoke): a tiny model, one problem, about a group an arm
    "--problems", "durations", "--max-time", "1", "--singles", "0", "--policy", "transformers:{tiny_model}",
    "--group-size", "2", "--max-new-tokens", "16",
)  # fmt: skip

DEFAULT_PROBLEMS = "roman_numerals,durations"
PROBLEM_DIRS: list[Path] = importlib.import_module("benchmarks.yield").PROBLEM_DIRS  # `yield` is a keyword


def grid(spec: str) -> list[MemberSpec]:
    """The embedded model at two temperatures and two templates."""
    return [
        MemberSpec(spec, temperature=t, template=template, name=f"t{t}-{template}")
        for t in (0.6, 1.1)
        for template in ("directed", "standard")
    ]


@dataclass
class Outcome:
    gain: float | None  # (best - seed) / |seed|
    valid_per_1k: float
    groups: int
    wall_s: float
    shares: dict[str, float]


@dataclass(frozen=True)
class Budget:
    """What every run gets alike: wall seconds, and optionally a smaller group or completion than the problem's."""

    max_time: float
    group_size: int | None = None
    max_new_tokens: int | None = None


def run_arm(
    folder: Path, policy: Policy, members: list[MemberSpec], allocation: str, seed: int, budget: Budget, work: Path
) -> Outcome:
    problem = load_problem(folder)
    archive = Archive(work / f"{problem.name}-{allocation}-{len(members)}-{seed}-{time.monotonic_ns()}.db")
    options = RunOptions.for_problem(
        problem.config.search,
        workers=2,
        max_evaluations=10**9,
        group_size=budget.group_size,
        max_new_tokens=budget.max_new_tokens,
        seed=seed,
        policy=members[0].spec,
        policies=[m.as_dict() for m in members],
        allocation=allocation,
        asks="base",
        stall_groups=0,
        sandbox="process",
    )
    run = open_run(archive, problem, options).run
    box = make_sandbox("process", workers=options.workers)
    loop = SearchLoop(problem, archive, policy, box, run, options)
    # No group starts after the time is up; the one being sampled finishes and every queued child is scored. (The
    # run's own --max-time would cut the group in flight, which leaves a shared in-process model told to stop.)
    timer = threading.Timer(budget.max_time, loop.finish_generating)
    started = time.monotonic()
    timer.start()
    try:
        run_search(loop)
    finally:
        timer.cancel()
        box.close()
    wall = time.monotonic() - started
    scored = archive.scored_programs(run.id)
    seed_scalar = scored[0].scalar if scored else None
    valid = [p.scalar for p in scored if p.error_kind is None and p.scalar is not None]
    best = max(valid) if valid else None
    summary = archive.summarize(archive.find_run(run.id), signs(problem.components), worst_values(problem.components))  # type: ignore[arg-type]
    y = summary_yield(summary)
    archive.close()
    gain = None
    if seed_scalar is not None and best is not None:
        gain = (best - seed_scalar) / max(abs(seed_scalar), 1e-9)
    shares = {m["name"]: m["share"] for m in summary.members}
    return Outcome(gain, y.per_1k_tokens, summary.groups, wall, shares)


def mean_and_spread(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.pstdev(values) if len(values) > 1 else 0.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=DEFAULT_PROBLEMS, help="comma-separated names, or 'all'")
    ap.add_argument("--max-time", type=float, default=300.0, help="seconds per run (equal for every arm)")
    ap.add_argument("--seeds", default="0", help="comma-separated run seeds")
    ap.add_argument("--policy", default="embedded")
    ap.add_argument("--singles", default="0,1,2,3", help="which members also run alone (indexes into the grid)")
    ap.add_argument("--group-size", type=int, default=None, help="G for every run (default: the problem's)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="cap per completion (default: the problem's)")
    args = ap.parse_args(argv)
    budget = Budget(args.max_time, args.group_size, args.max_new_tokens)
    folders = {f.name: f for f in PROBLEM_DIRS}
    wanted = list(folders) if args.problems == "all" else [w for w in args.problems.split(",") if w]
    if set(wanted) - set(folders):
        print(f"unknown problems {sorted(set(wanted) - set(folders))}; choose from {list(folders)}", file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",") if s]
    members = grid(args.policy)
    singles = [members[int(i)] for i in args.singles.split(",") if i]
    console = Console(width=None if sys.stdout.isatty() else 200)
    policy = make_policy(args.policy)
    table = Table(title=f"ensemble: {len(members)} members of {args.policy}, {args.max_time:.0f} s per run")
    for col in ("problem", "seed", "arm", "groups", "gain over seed", "valid/1k tok", "shares", "wall s"):
        table.add_column(col, justify="left" if col in ("problem", "arm", "shares") else "right")
    gains: dict[str, dict[str, list[float]]] = {"bandit": {}, "uniform": {}, "best_single": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in wanted:
            for seed in seeds:
                arms: dict[str, Outcome] = {}
                for single in singles:
                    arms[f"single:{single.name}"] = run_arm(
                        folders[name], policy, [single], "bandit", seed, budget, Path(tmp)
                    )
                for allocation in ("uniform", "bandit"):
                    arms[allocation] = run_arm(folders[name], policy, members, allocation, seed, budget, Path(tmp))
                for arm, o in arms.items():
                    shares = ", ".join(f"{k} {v:.0%}" for k, v in o.shares.items()) if len(o.shares) > 1 else ""
                    gain = "-" if o.gain is None else f"{o.gain:+.4f}"
                    rate = f"{o.valid_per_1k:.2f}"
                    row = (name, str(seed), arm, str(o.groups), gain, rate, shares, f"{o.wall_s:.0f}")
                    table.add_row(*row)
                    console.print(" | ".join(row), highlight=False)
                single_gains = [o.gain for a, o in arms.items() if a.startswith("single:") and o.gain is not None]
                for arm, value in (
                    ("bandit", arms["bandit"].gain),
                    ("uniform", arms["uniform"].gain),
                    ("best_single", max(single_gains) if single_gains else None),
                ):
                    gains[arm].setdefault(name, []).append(value if value is not None else 0.0)
    policy.close()
    console.print(table)
    per_problem = {arm: {p: statistics.fmean(v) for p, v in by.items()} for arm, by in gains.items()}
    improved = sum(
        per_problem["bandit"][p] > max(per_problem["uniform"][p], per_problem["best_single"][p]) for p in wanted
    )
    said = []
    for arm in ("bandit", "uniform", "best_single"):
        over_seeds = [statistics.fmean(v[i] for v in gains[arm].values()) for i in range(len(seeds))]
        mean, spread = mean_and_spread(over_seeds)
        said.append(f"{arm}={mean:.4f}±{spread:.4f}")
    print(f"ensemble_allocation {' '.join(said)} improved={improved}/{len(wanted)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
