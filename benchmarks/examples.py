"""The shipped examples in other languages and over several files, in each sandbox: does the search make progress?

For each example (`problems/roman_numerals_c`, `roman_numerals_rust`, `knapsack_files`; `--examples` chooses)
and each sandbox (`--sandboxes process,docker`), one fresh run of `--max-time` seconds through the same API as
`benchmarks.yield` (its `run_problem`: the problem's own defaults, as `evolve run` would pose it; no group starts
after the time is up, and children already queued are still scored). Then, from that run's archive: groups,
variants, new valid children (the seed excluded), build errors, other errors, the seed's and the best scalar,
mean build and evaluation seconds of the valid evaluations (the seed's included) and of the build errors, and
the seconds spent sampling. The last line is `examples progress=K/N`: of the N runs (example x sandbox), K found
a program better than the seed.

Usage: python -m benchmarks.examples [--examples roman_numerals_c,knapsack_files] [--sandboxes process,docker]
       [--max-time 300] [--seed 0] [--policy embedded] [--keep DIR] [--max-new-tokens N] [--group-size G]
`--max-new-tokens`, `--group-size`: the smoke run's (a tiny model's group of seconds); the problem's own otherwise.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from rich.console import Console
from rich.table import Table

from evolve.archive import Archive
from evolve.fitness import signs
from evolve.problem import load_problem
from evolve.yields import worst_values
from policies.from_spec import make_policy
from policies.policy import Policy

KIND = "experiment"
SMOKE_ARGS = (  # a run of seconds (python -m benchmarks --smoke): a tiny model, about one group
    "--examples", "knapsack_files", "--sandboxes", "process", "--max-time", "1",
    "--policy", "transformers:{tiny_model}", "--max-new-tokens", "16", "--group-size", "2",
)  # fmt: skip

_yield = importlib.import_module("benchmarks.yield")  # `yield` is a keyword
EXAMPLES = {
    name: _yield.ROOT / "problems" / name for name in ("roman_numerals_c", "roman_numerals_rust", "knapsack_files")
}
SANDBOXES = ("process", "docker")


class Scored(NamedTuple):
    """One evaluation of a run, as far as this benchmark reads it."""

    child: bool  # False for the seed
    error_kind: str | None
    scalar: float | None
    build_s: float | None
    duration_s: float


@dataclass(frozen=True)
class Times:
    """Mean seconds of some evaluations: their builds (None where none built) and their whole evaluations."""

    count: int
    build_s: float | None
    evaluation_s: float | None

    @classmethod
    def of(cls, rows: list[Scored]) -> Times:
        builds = [r.build_s for r in rows if r.build_s is not None]
        return cls(len(rows), _mean(builds), _mean(r.duration_s for r in rows))


@dataclass(frozen=True)
class ExampleRun:
    """What one run of one example in one sandbox came to, read from its archive."""

    example: str
    sandbox: str
    groups: int
    variants: int
    valid_children: int
    build_errors: int
    other_errors: int
    seed_scalar: float | None
    best_scalar: float | None
    valid: Times  # every evaluation without error, the seed's included
    failed_builds: Times
    sampling_s: float
    wall_s: float
    reason: str

    @property
    def improved(self) -> bool:
        seed, best = self.seed_scalar, self.best_scalar
        return seed is not None and best is not None and best > seed + 1e-9


def _mean(values: Iterable[float]) -> float | None:
    kept = list(values)
    return statistics.fmean(kept) if kept else None


def measured(folder: Path, sandbox: str, archive: Archive, wall_s: float, reason: str) -> ExampleRun:
    """The row of the run in `archive` (a fresh archive holds one run)."""
    problem = load_problem(folder)
    run = archive.find_run(None)
    assert run is not None, f"{archive.url} holds no run"
    summary = archive.summarize(run, signs(problem.components), worst_values(problem.components))
    rows = [
        Scored(p.parent_id is not None, e.error_kind, e.scalar, e.build_s, e.duration_s)
        for p, e in archive.evaluation_rows(run)
    ]
    valid = [r for r in rows if r.error_kind is None]
    seed = next((r for r in rows if not r.child), None)
    return ExampleRun(
        example=folder.name,
        sandbox=sandbox,
        groups=summary.groups,
        variants=sum(summary.variants.values()),
        valid_children=sum(r.child for r in valid),
        build_errors=summary.errors.get("build", 0),
        other_errors=sum(n for kind, n in summary.errors.items() if kind != "build"),
        seed_scalar=seed.scalar if seed is not None and seed.error_kind is None else None,
        best_scalar=max((r.scalar for r in valid if r.scalar is not None), default=None),
        valid=Times.of(valid),
        failed_builds=Times.of([r for r in rows if r.error_kind == "build"]),
        sampling_s=float(summary.telemetry.get("generation_s") or 0.0),
        wall_s=wall_s,
        reason=reason,
    )


def run_example(folder: Path, sandbox: str, policy: Policy, args: argparse.Namespace, work: Path) -> ExampleRun:
    """One fresh run of `folder` in `sandbox` (yield's run_problem, with no group budget), then its row."""
    sampling = {"max_new_tokens": args.max_new_tokens, "group_size": args.group_size}  # None: the problem's own
    done = _yield.run_problem(folder, policy, args.policy, None, args.max_time, args.seed, sandbox, work, sampling)
    wall_s, reason = done.wall_s, done.reason
    archive = Archive(_yield.archive_file(work, load_problem(folder)), create=False)
    try:
        return measured(folder, sandbox, archive, wall_s, reason)
    finally:
        archive.close()


COLUMNS = (
    "example", "sandbox", "groups", "variants", "valid children", "build errors", "other errors", "seed", "best",
    "build s (valid)", "eval s (valid)", "build s (build err.)", "eval s (build err.)", "sampling s", "wall s",
)  # fmt: skip


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table_row(r: ExampleRun) -> list[str]:
    scalar = lambda v: "-" if v is None else f"{v:.4g}"  # noqa: E731
    return [
        r.example, r.sandbox, str(r.groups), str(r.variants), str(r.valid_children), str(r.build_errors),
        str(r.other_errors), scalar(r.seed_scalar), scalar(r.best_scalar) + (" +" if r.improved else ""),
        _seconds(r.valid.build_s), _seconds(r.valid.evaluation_s), _seconds(r.failed_builds.build_s),
        _seconds(r.failed_builds.evaluation_s), f"{r.sampling_s:.0f}", f"{r.wall_s:.0f}",
    ]  # fmt: skip


class UsageError(Exception):
    """A flag that cannot be run as given; its message is the one line to print."""


def _choices(given: str, known: Iterable[str], what: str) -> list[str]:
    """The comma-separated names in `given`, each one of `known`."""
    names, wanted = list(known), [w for w in given.split(",") if w]
    unknown = [w for w in wanted if w not in names]
    if unknown or not wanted:
        raise UsageError(f"unknown {what} {unknown or given!r}; choose from {','.join(names)}")
    return wanted


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", default=",".join(EXAMPLES), help="comma-separated example names")
    ap.add_argument("--sandboxes", default=",".join(SANDBOXES), help="comma-separated: process, docker")
    ap.add_argument("--max-time", type=float, default=300.0, help="seconds per run: no group starts after it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--policy", default="embedded")
    ap.add_argument("--keep", type=Path, default=None, help="keep the archives in this folder (default: discard)")
    # For a smoke run (python -m benchmarks --smoke), so that a tiny model's group takes seconds
    ap.add_argument("--max-new-tokens", type=int, default=None, help="cap per completion (default: the problem's)")
    ap.add_argument("--group-size", type=int, default=None, help="G (default: the problem's)")
    args = ap.parse_args(argv)
    try:
        return run_all(args)
    except UsageError as exc:
        print(f"examples: {exc}", file=sys.stderr)
        return 2


def run_all(args: argparse.Namespace) -> int:
    examples = _choices(args.examples, EXAMPLES, "example")
    sandboxes = _choices(args.sandboxes, SANDBOXES, "sandbox")
    if "docker" in sandboxes:
        from sandboxes.docker_pool import docker_available

        if (why := docker_available()) is not None:  # said before the model loads
            raise UsageError(f"--sandboxes docker: {why}; start dockerd or pass --sandboxes process")
    console = Console(width=None if sys.stdout.isatty() else 240)  # a log keeps the table's columns whole
    runs: list[ExampleRun] = []
    with tempfile.TemporaryDirectory() as tmp:
        top = args.keep or Path(tmp)
        works = {sandbox: top / f"{sandbox}-seed{args.seed}" for sandbox in sandboxes}
        for work in works.values():
            for name in examples:
                if _yield.archive_file(work, load_problem(EXAMPLES[name])).exists():
                    raise UsageError(f"{work} holds a run of {name} already; pass another --keep folder")
            work.mkdir(parents=True, exist_ok=True)
        policy = make_policy(args.policy)
        try:
            for name in examples:
                for sandbox in sandboxes:
                    run = run_example(EXAMPLES[name], sandbox, policy, args, works[sandbox])
                    runs.append(run)
                    console.print(" | ".join(table_row(run)) + f" | {run.reason}", highlight=False)
        finally:
            policy.close()
    table = Table(title=f"examples: {args.policy}, {args.max_time:.0f} s per run, seed {args.seed}")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("example", "sandbox") else "right")
    for run in runs:
        table.add_row(*table_row(run))
    console.print(table)
    print(f"examples progress={sum(r.improved for r in runs)}/{len(runs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
