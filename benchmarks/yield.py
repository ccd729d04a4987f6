"""Yield of the real search loop with the embedded model on problems it has never seen.

Runs `evolve run`'s machinery (SearchLoop, process sandbox, archive on disk) for a fixed number of groups with a
fixed seed per problem, over every shipped example (problems/: C, Rust and a program of several files among
them), the problems in benchmarks/problems/ (written for this benchmark and not tuned on) and a folder fresh from
`evolve init` (`evolve_init`). A folder given to `--keep` that already holds a problem's archive resumes that
run, which stops at once where it reached its group budget: a run cut off goes on where it stopped. Each problem
is posed with its own defaults, as a new user would run it. Per problem: new valid children per completion and per 1,000
tokens, the shares of unchanged, duplicate and unparseable variants, and the best scalar relative to the seed's;
and what the children brought (evolve.yields): children that beat their parent's scalar, per 1,000 tokens (the
headline), new bests, the share of children evaluated that scored the worst value on every component (`zero`) and
those that behaved exactly as their parent. `python -m benchmarks.yield_compare BEFORE AFTER` reads two `--keep`
folders back and compares them.

With `--compare-structured` each problem runs twice from the same seed, `--structured off` then `on` (the
answer's shape held by a grammar while sampling; a policy that can, llama.cpp by default), and the last line
compares the two: unparseable variants, new valid children per 1,000 tokens and tokens per second.

`--lead-comment on` asks for a lead comment (`# Change: ...` first in each fenced block of a `full` answer held
to its shape, issue 37): run once with it on and once off (the default, as the engine's) for its A/B.

`--compare OPTION=A,B` runs each problem under each value of one run option (e.g. `spent_parent_weight=1,0.5`,
`lead_comment=off,on`, `copy_guard=off,on`) from the same seed, and ends with `compare OPTION=A: ... | OPTION=B: ...`.

Usage: python -m benchmarks.yield [--groups 6] [--problems roman_numerals,durations] [--max-time 600]
       python -m benchmarks.yield --compare-structured [--groups 6] [--keep results/yield]
       python -m benchmarks.yield --policy llama:embedded [--lead-comment on]
Smoke run (python -m benchmarks --smoke): one group of minimizer by a tiny untaught model, `--max-new-tokens 16
--group-size 2` (both None otherwise: the problem's own).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from evolve.archive import Archive, RunRecord, summary_yield
from evolve.fitness import signs
from evolve.group_sampler import structured_by
from evolve.loop import SearchLoop, run_search
from evolve.options import RunOptions
from evolve.problem import Problem, load_problem
from evolve.problem.config import ComponentSpec
from evolve.problem.scaffold import scaffold
from evolve.runs import open_run
from evolve.yields import QualityCounts, Yield, worst_values
from policies.from_spec import make_policy
from policies.policy import Policy
from sandboxes.backends import make_sandbox

KIND = "experiment"
SMOKE_ARGS = (  # a run of seconds (python -m benchmarks --smoke): a tiny model, one group
    "--groups", "1", "--problems", "minimizer", "--policy", "transformers:{tiny_model}",
    "--max-new-tokens", "16", "--group-size", "2",
)  # fmt: skip

ROOT = Path(__file__).resolve().parent.parent
FIRST = ("roman_numerals", "bin_packing", "circle_packing")  # the order of the tables in docs/yield.md
SHIPPED = sorted((p for p in (ROOT / "problems").iterdir() if (p / "problem.toml").is_file()), key=lambda p: p.name)
PROBLEM_DIRS = [  # every shipped problem (C, Rust and several files included), then the benchmark's own
    *(ROOT / "problems" / name for name in FIRST),
    *(p for p in SHIPPED if p.name not in FIRST),
    *sorted(p for p in (ROOT / "benchmarks" / "problems").iterdir() if (p / "problem.toml").is_file()),
]
INIT = "evolve_init"  # made by `evolve init` in the work folder at run time


def default_options(
    problem: Problem, groups: int | None, seed: int, policy: str, sandbox: str, given: Mapping[str, Any] | None = None
) -> RunOptions:
    """What `evolve run PROBLEM` would use, with a group budget (None: none) instead of an evaluation budget, and
    `given` (option name → value) over the defaults."""
    return RunOptions.for_problem(
        problem.config.search,
        workers=2,
        max_evaluations=10**9,
        seed=seed,
        policy=policy,
        sandbox=sandbox,
        max_groups=groups,
        **dict(given or {}),
    )


def archive_file(work: Path, problem: Problem) -> Path:
    """Where `run_problem` keeps a problem's archive in its work folder (other benchmarks read it afterwards)."""
    return work / f"{problem.name}.db"


@dataclass(frozen=True)
class ProblemYield:
    """One fresh run of one problem: its yield, the seed's and the best scalar, and what it cost."""

    name: str
    yields: Yield
    seed_scalar: float | None
    best: float | None
    wall_s: float
    groups: int
    reason: str
    tokens_per_s: float  # while sampling (the archive's generation seconds), 0 when nothing was sampled

    @property
    def improved(self) -> bool:
        return self.seed_scalar is not None and self.best is not None and self.best > self.seed_scalar + 1e-9

    def row(self) -> list[str]:
        y, seed, best = self.yields, self.seed_scalar, self.best
        ratio = f"{best / seed:.3f}" if best is not None and seed else "-"
        return [
            self.name, str(self.groups), str(y.completions), str(y.tokens), str(y.new_valid),
            f"{y.per_completion:.2f}", f"{y.per_1k_tokens:.2f}", str(y.quality.beats_parent),
            f"{y.beats_parent_per_1k_tokens:.2f}", str(y.quality.new_best), f"{y.zero_share:.0%}",
            str(y.quality.same), f"{y.unchanged:.0%}", f"{y.duplicate:.0%}",
            f"{y.unparseable:.0%}", f"{y.cut_share:.0%}", f"{self.tokens_per_s:.1f}",
            f"{seed:.4g}" if seed is not None else "-", f"{best:.4g}" if best is not None else "-",
            ratio + (" +" if self.improved else ""), f"{self.wall_s:.0f}",
        ]  # fmt: skip


COLUMNS = (
    "problem", "groups", "compl.", "tokens", "new valid", "/compl.", "/1k tok", "beats_parent", "beats /1k tok",
    "new bests", "zero share", "same behaviour", "unchanged", "duplicate",
    "unparseable", "cut", "tok/s", "seed", "best", "best/seed", "wall s",
)  # fmt: skip


def run_problem(
    folder: Path,
    policy: Policy,
    policy_spec: str,
    groups: int | None,
    max_time: float,
    seed: int,
    sandbox: str,
    work: Path,
    given: Mapping[str, Any] | None = None,
) -> ProblemYield:
    """One fresh run of `folder` with its own defaults (`given` options over them), its archive kept in `work`."""
    problem = load_problem(folder)
    archive = Archive(archive_file(work, problem))
    options = default_options(problem, groups, seed, policy_spec, sandbox, given)
    run = open_run(archive, problem, options).run
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
    finished = archive.find_run(run.id) or run  # as the run left it (its state saved)
    out = stored_yield(folder.name, archive, finished, problem.components, wall, reason)
    archive.close()
    return out


def stored_yield(
    name: str, archive: Archive, run: RunRecord, components: list[ComponentSpec], wall_s: float, reason: str
) -> ProblemYield:
    """A run's figures as its archive holds them (what `run_problem` reports, and `benchmarks.yield_compare`
    reads back from kept archives, those of earlier code included)."""
    scored = archive.scored_programs(run.id)
    valid = [p.scalar for p in scored if p.error_kind is None and p.scalar is not None]
    summary = archive.summarize(run, signs(components), worst_values(components))
    return ProblemYield(
        name=name,
        yields=summary_yield(summary),
        seed_scalar=scored[0].scalar if scored else None,
        best=max(valid) if valid else None,
        wall_s=wall_s,
        groups=archive.count_groups(run.id),
        reason=reason,
        tokens_per_s=float(summary.telemetry.get("tokens_per_s") or 0.0),
    )


def pooled(runs: list[ProblemYield]) -> Yield:
    """The runs' yields as one: completions, tokens, children, cut completions, variant statuses and what the
    children brought, summed."""
    ys = [r.yields for r in runs]
    statuses: Counter[str] = Counter()
    for y in ys:
        statuses.update(y.statuses)
    quality = {f.name: sum(getattr(y.quality, f.name) for y in ys) for f in fields(QualityCounts)}
    return Yield(
        sum(y.completions for y in ys),
        sum(y.tokens for y in ys),
        sum(y.new_valid for y in ys),
        dict(statuses),
        cut=sum(y.cut for y in ys),
        quality=QualityCounts(**quality),
    )


def sampling_rate(runs: list[ProblemYield]) -> float:
    """Tokens per second over all runs (each run's tokens over its sampling seconds), 0 when none sampled."""
    seconds = sum(r.yields.tokens / r.tokens_per_s for r in runs if r.tokens_per_s)
    return sum(r.yields.tokens for r in runs) / seconds if seconds else 0.0


def comparison_line(off: list[ProblemYield], on: list[ProblemYield]) -> str:
    """The last line of `--compare-structured`; docs/yield.md quotes it."""
    y_off, y_on = pooled(off), pooled(on)
    fewer = [r.name for r in on if r.yields.new_valid < r.yields.completions]
    return (
        f"structured unparseable_off={100 * y_off.unparseable:.1f}% unparseable_on={100 * y_on.unparseable:.1f}% "
        f"children_per_1k_tokens_off={y_off.per_1k_tokens:.2f} children_per_1k_tokens_on={y_on.per_1k_tokens:.2f} "
        f"tok_s_off={sampling_rate(off):.1f} tok_s_on={sampling_rate(on):.1f} "
        f"under_one_child_per_completion_on={','.join(fewer) or 'none'}"
    )


def parse_compare(text: str) -> tuple[str, list[Any]]:
    """`--compare NAME=A,B[,...]`: a run option and the values each problem runs under, typed as the option is."""
    name, _, values = text.partition("=")
    name = name.strip().replace("-", "_")
    kinds = {f.name: f.type for f in fields(RunOptions)}
    if name not in kinds or not values:
        raise SystemExit(f"--compare {text}: give OPTION=A,B with a run option's name (spent_parent_weight=1,0.5)")
    kind = str(kinds[name])
    cast: Any = str
    if kind.startswith("bool"):
        cast = lambda v: v.strip().lower() in ("1", "true", "on", "yes")  # noqa: E731
    elif kind.startswith("float"):
        cast = float
    elif kind.startswith("int"):
        cast = int
    return name, [cast(v) for v in values.split(",")]


def compare_line(name: str, runs: Mapping[str, list[ProblemYield]]) -> str:
    """The last line of `--compare`: per value, new valid children per completion and per 1,000 tokens, the copy
    shares, the problems under one child per completion and the problems improved on their seed."""
    cells = []
    for value, done in runs.items():
        y = pooled(done)
        fewer = [r.name for r in done if r.yields.new_valid < r.yields.completions]
        cells.append(
            f"{name}={value}: per_completion={y.per_completion:.2f} per_1k_tokens={y.per_1k_tokens:.2f} "
            f"duplicate={100 * y.duplicate:.0f}% unchanged={100 * y.unchanged:.0f}% "
            f"unparseable={100 * y.unparseable:.0f}% improved={sum(r.improved for r in done)}/{len(done)} "
            f"under_one={len(fewer)}"
        )
    return "compare " + " | ".join(cells)


def guard_turns(policy: Policy) -> int:
    """How often the policy's copy guard has turned a row off a copy so far (0 for a policy without one)."""
    counts = getattr(policy, "copy_guard", None)
    return int(getattr(counts, "turned", 0))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", type=int, default=6, help="groups per problem (fixed seed per problem)")
    ap.add_argument("--problems", default="", help="comma-separated names (default: all)")
    ap.add_argument(
        "--max-time", type=float, default=600.0, help="per problem: no group starts after this many seconds"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=1, help="run each problem from seeds --seed, --seed + 1, ...")
    ap.add_argument("--policy", default=None, help="default transformers:embedded; llama:embedded when comparing")
    ap.add_argument("--sandbox", default="process")
    ap.add_argument("--keep", type=Path, default=None, help="keep the archives in this folder (default: discard)")
    ap.add_argument("--others-view", default="code", choices=("code", "diff"), help="how prompts show other programs")
    ap.add_argument("--compare-structured", action="store_true", help="each problem with --structured off, then on")
    ap.add_argument("--lead-comment", default="off", choices=("on", "off"), help="the `# Change: ...` lead line")
    ap.add_argument("--compare", default=None, help="OPTION=A,B: each problem under each value of a run option")
    # For a smoke run (python -m benchmarks --smoke), so that a tiny model's group takes seconds: None, the problem's
    ap.add_argument("--max-new-tokens", type=int, default=None, help="cap per completion (default: the problem's)")
    ap.add_argument("--group-size", type=int, default=None, help="G (default: the problem's)")
    args = ap.parse_args(argv)
    if args.compare and args.compare_structured:
        print("--compare and --compare-structured: give one of them", file=sys.stderr)
        return 2
    compared = parse_compare(args.compare) if args.compare else None
    if compared and len(set(compared[1])) < len(compared[1]):
        print(f"--compare {args.compare}: each value once", file=sys.stderr)
        return 2
    spec = args.policy or ("llama:embedded" if args.compare_structured else "transformers:embedded")
    wanted = [w for w in args.problems.split(",") if w]
    names = [f.name for f in PROBLEM_DIRS] + [INIT]
    unknown = set(wanted) - set(names)
    if unknown:
        print(f"unknown problems {sorted(unknown)}; choose from {names}", file=sys.stderr)
        return 2
    console = Console(width=None if sys.stdout.isatty() else 200)  # a log keeps the table's columns whole
    policy = make_policy(spec)
    if args.compare_structured and not structured_by(policy):
        print(f"{spec} cannot hold its answers to a grammar; give a policy that can (llama:...)", file=sys.stderr)
        return 2
    base = {"others_view": args.others_view, "lead_comment": args.lead_comment == "on"}
    base |= {"max_new_tokens": args.max_new_tokens, "group_size": args.group_size}  # None: not given
    if args.compare_structured:
        modes = {mode: base | {"structured": mode} for mode in ("off", "on")}
    elif compared:
        modes = {str(value): base | {compared[0]: value} for value in compared[1]}
    else:
        modes = {"auto": base}
    runs: dict[str, list[ProblemYield]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        folders = [f for f in PROBLEM_DIRS if not wanted or f.name in wanted]
        if not wanted or INIT in wanted:
            if not (work / INIT / "problem.toml").exists():
                scaffold(work / INIT)
            folders.append(work / INIT)
        for seed in range(args.seed, args.seed + args.seeds):
            for folder in folders:
                for mode, given in modes.items():
                    where = work / mode if len(modes) > 1 else work
                    where = where / f"s{seed}" if args.seeds > 1 else where
                    where.mkdir(parents=True, exist_ok=True)
                    if compared:  # each arm from the same sampler state (a warm prompt cache shifts the samples)
                        policy.close()
                        policy = make_policy(spec)
                    turned_before = guard_turns(policy)
                    r = run_problem(folder, policy, spec, args.groups, args.max_time, seed, args.sandbox, where, given)
                    runs[mode].append(r)
                    line = f"{folder.name} seed {seed} ({mode}): {r.reason}; {r.yields.line()}"
                    line += f"; copy guard turns {guard_turns(policy) - turned_before}"
                    console.print(line, highlight=False)
    policy.close()
    for mode, done in runs.items():
        what = f"{compared[0]} {mode}" if compared else f"structured {mode}"
        title = f"yield: {spec}, {what}, {args.groups} groups per problem, seeds {args.seed}..+{args.seeds - 1}"
        title += f", lead comment {args.lead_comment}"
        table = Table(title=title)
        for col in COLUMNS:
            table.add_column(col, justify="left" if col == "problem" else "right")
        for r in done:
            table.add_row(*r.row())
        console.print(table)
        total = pooled(done)
        improved = sum(r.improved for r in done)
        label = compared[0] if compared else "structured"
        print(
            f"yield {label}={mode} children_per_completion={total.per_completion:.2f} "
            f"children_per_1k_tokens={total.per_1k_tokens:.2f} improved={improved}/{len(done)} "
            f"beats_parent={total.quality.beats_parent} "
            f"beats_parent_per_1k_tokens={total.beats_parent_per_1k_tokens:.2f} "
            f"zero_share={100 * total.zero_share:.1f}% same_behaviour={total.quality.same} "
            f"new_best={total.quality.new_best}"
        )
    if args.compare_structured:
        print(comparison_line(runs["off"], runs["on"]))
    elif compared:
        print(compare_line(compared[0], runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
