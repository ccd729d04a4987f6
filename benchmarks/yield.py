"""Yield of the real search loop with the embedded model on problems it has never seen.

Runs `evolve run`'s machinery (SearchLoop, process sandbox, archive on disk) for a fixed number of groups with a
fixed seed per problem, over the three shipped examples, the problems in benchmarks/problems/ (written for this
benchmark and not tuned on) and a folder fresh from `evolve init` (`evolve_init`). Each problem is posed with
its own defaults, as a new user would run it. Per problem: new valid children per completion and per 1,000
tokens, the shares of unchanged, duplicate and unparseable variants, and the best scalar relative to the seed's.

Usage: python -m benchmarks.yield [--groups 6] [--problems roman_numerals,durations] [--max-time 600]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evolve.archive import Archive, summary_yield
from evolve.fitness import signs
from evolve.loop import SearchLoop, run_search
from evolve.problem import Problem, load_problem
from evolve.problem.scaffold import scaffold
from evolve.runs import RunOptions, open_run
from evolve.yields import Yield
from policies.base import Policy
from policies.factory import make_policy
from sandboxes.factory import make_sandbox

ROOT = Path(__file__).resolve().parent.parent
PROBLEM_DIRS = [
    ROOT / "problems" / "roman_numerals",
    ROOT / "problems" / "bin_packing",
    ROOT / "problems" / "circle_packing",
    *sorted(p for p in (ROOT / "benchmarks" / "problems").iterdir() if (p / "problem.toml").is_file()),
]
INIT = "evolve_init"  # made by `evolve init` in the work folder at run time


def default_options(problem: Problem, groups: int | None, seed: int, policy: str, sandbox: str) -> RunOptions:
    """What `evolve run PROBLEM` would use, with a group budget (None: none) instead of an evaluation budget."""
    return RunOptions.for_problem(
        problem.config.search,
        workers=2,
        max_evaluations=10**9,
        seed=seed,
        policy=policy,
        sandbox=sandbox,
        max_groups=groups,
    )


def archive_file(work: Path, problem: Problem) -> Path:
    """Where `run_problem` keeps a problem's archive in its work folder (other benchmarks read it afterwards)."""
    return work / f"{problem.name}.db"


def run_problem(
    folder: Path,
    policy: Policy,
    policy_spec: str,
    groups: int | None,
    max_time: float,
    seed: int,
    sandbox: str,
    work: Path,
) -> tuple[Yield, float | None, float | None, float, int, str]:
    """One fresh run; returns (yield, seed scalar, best scalar, wall seconds, groups, stop reason)."""
    problem = load_problem(folder)
    archive = Archive(archive_file(work, problem))
    options = default_options(problem, groups, seed, policy_spec, sandbox)
    run, _ = open_run(archive, problem, options)
    box = make_sandbox(sandbox, workers=options.workers)
    loop = SearchLoop(problem, archive, policy, box, run, options)
    started = time.monotonic()
    # The time cap stops new groups only: children already generated are still evaluated and counted.
    timer = threading.Timer(max_time, loop.finish_generating)
    timer.start()
    try:
        reason = run_search(loop)
    finally:
        timer.cancel()
        box.close()
    wall = time.monotonic() - started
    scored = archive.scored_programs(run.id)
    seed_scalar = scored[0].scalar if scored else None
    valid = [p.scalar for p in scored if p.error_kind is None and p.scalar is not None]
    best = max(valid) if valid else None
    run_row = archive.find_run(run.id)
    y = summary_yield(archive.summarize(run_row, signs(problem.components)))
    groups_made = archive.count_groups(run.id)
    archive.close()
    return y, seed_scalar, best, wall, groups_made, reason


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=6, help="groups per problem (fixed seed per problem)")
    ap.add_argument("--problems", default="", help="comma-separated names (default: all)")
    ap.add_argument(
        "--max-time", type=float, default=600.0, help="per problem: no group starts after this many seconds"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", default="transformers:embedded")
    ap.add_argument("--sandbox", default="process")
    ap.add_argument("--keep", type=Path, default=None, help="keep the archives in this folder (default: discard)")
    args = ap.parse_args(argv)
    wanted = [w for w in args.problems.split(",") if w]
    names = [f.name for f in PROBLEM_DIRS] + [INIT]
    unknown = set(wanted) - set(names)
    if unknown:
        print(f"unknown problems {sorted(unknown)}; choose from {names}", file=sys.stderr)
        return 2
    console = Console(width=None if sys.stdout.isatty() else 200)  # a log keeps the table's columns whole
    policy = make_policy(args.policy)
    table = Table(title=f"yield: {args.policy}, {args.groups} groups per problem, seed {args.seed}")
    for col in (
        "problem",
        "groups",
        "compl.",
        "tokens",
        "new valid",
        "/compl.",
        "/1k tok",
        "unchanged",
        "duplicate",
        "unparseable",
        "seed",
        "best",
        "best/seed",
        "wall s",
    ):
        table.add_column(col, justify="left" if col == "problem" else "right")
    total = Yield()
    improved = 0
    statuses: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        folders = [f for f in PROBLEM_DIRS if not wanted or f.name in wanted]
        if not wanted or INIT in wanted:
            if not (work / INIT / "problem.toml").exists():
                scaffold(work / INIT)
            folders.append(work / INIT)
        for folder in folders:
            y, seed_scalar, best, wall, groups, reason = run_problem(
                folder, policy, args.policy, args.groups, args.max_time, args.seed, args.sandbox, work
            )
            better = seed_scalar is not None and best is not None and best > seed_scalar + 1e-9
            improved += better
            ratio = f"{best / seed_scalar:.3f}" if best is not None and seed_scalar else "-"
            table.add_row(
                folder.name,
                str(groups),
                str(y.completions),
                str(y.tokens),
                str(y.new_valid),
                f"{y.per_completion:.2f}",
                f"{y.per_1k_tokens:.2f}",
                f"{y.unchanged:.0%}",
                f"{y.duplicate:.0%}",
                f"{y.unparseable:.0%}",
                f"{seed_scalar:.4g}" if seed_scalar is not None else "-",
                f"{best:.4g}" if best is not None else "-",
                ratio + (" +" if better else ""),
                f"{wall:.0f}",
            )
            console.print(f"{folder.name}: {reason}; {y.line()}", highlight=False)
            total.completions += y.completions
            total.tokens += y.tokens
            total.new_valid += y.new_valid
            for k, v in y.statuses.items():
                statuses[k] = statuses.get(k, 0) + v
    total.statuses = statuses
    policy.close()
    console.print(table)
    print(
        f"yield children_per_completion={total.per_completion:.2f} children_per_1k_tokens={total.per_1k_tokens:.2f} "
        f"improved={improved}/{len(folders)}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
