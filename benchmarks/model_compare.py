"""Which embedded model makes more children that beat their parent per hour on this machine: the fast one, the
strong one, or both under the bandit (AlphaEvolve's pairing of a fast and a strong model).

Protocol. Each arm is a set of policies; each runs `evolve run PROBLEM` in a subprocess, as a user would (the
process sandbox, seed `--seed`, `--max-time` seconds of search, no evaluation budget), on each problem, problem
by problem with the arms back to back (a machine that slows during the study slows every arm of a problem
alike). An arm of several members shares its groups by the bandit, each group costing its member and ask the
seconds it took (`--bandit-cost seconds`: the strong model's groups cost more). The archives stay in `--work`
as `<arm>-<problem>.db`; run again, a finished run stops at once and one cut off goes on (the time budget is
summed over resumes).

Per arm and problem, read from the archive (evolve.yields, as `evolve inspect` counts): search hours (the run's
own clock, the model's loading excluded), groups, tokens, children evaluated, children that beat their parent
(scalar view) and per hour, new bests, the share of children that scored nothing (`zero`), best over seed; for
an arm of several members, each member's groups and children that beat their parent. The last line, pooled
over the problems: `model_compare <arm>_per_hour=... beats_<arm>=N ... hours_per_arm=...`.

Run it on a quiet machine: decoding and evaluation share the cores (docs/policies.md), so anything else running
lowers every arm's figure. Counts are small at this size: report n, claim nothing the counts do not carry. A bias
against a slow arm: when the time runs out, the group being sampled is cut and not stored (evolve/loop.py), so up
to one group's time of each run leaves nothing; at 8 minutes a run that is up to 30% of a strong model's time.

Usage: python -m benchmarks.model_compare [--problems minimizer,tour_heuristic] [--max-time 600]
       [--arm fast=llama:embedded --arm 'both=llama:embedded[name=fast]+llama:embedded-1.5b[name=strong]']
       [--work DIR] [--seed 0]
Default arms: fast (llama:embedded, the 0.5B), strong (llama:embedded-1.5b, the `strong` extra), both.
Smoke run (python -m benchmarks --smoke): one group of minimizer by a tiny untaught model.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from evolve.archive import Archive
from evolve.fitness import signs
from evolve.report.aggregate import run_components
from evolve.yields import worst_values

_yield = importlib.import_module("benchmarks.yield")  # `yield` is a keyword: its reading of a kept archive

KIND = "experiment"
SMOKE_ARGS = (
    "--arm", "tiny=transformers:{tiny_model}", "--problems", "minimizer", "--max-groups", "1",
    "--max-new-tokens", "16", "--group-size", "2", "--work", "{scratch}",
)  # fmt: skip

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = {p.name: p for d in ("problems", "benchmarks/problems") for p in (ROOT / d).iterdir() if p.is_dir()}
DEFAULT_ARMS = (
    "fast=llama:embedded",
    "strong=llama:embedded-1.5b",
    "both=llama:embedded[name=fast]+llama:embedded-1.5b[name=strong]",
)


@dataclass(frozen=True)
class ArmRun:
    """One arm's run of one problem, as its archive holds it."""

    arm: str
    problem: str
    hours: float  # the run's own search time
    groups: int
    tokens: int
    evaluated: int  # children evaluated, errors included
    beats_parent: int
    new_best: int
    zero: int
    best_over_seed: float | None
    members: list[dict[str, Any]]  # per member: name, groups, improved (children that beat their parent)

    @property
    def per_hour(self) -> float:
        return self.beats_parent / self.hours if self.hours else 0.0


def parse_arm(text: str) -> tuple[str, list[str]]:
    """`NAME=SPEC[+SPEC...]`: the arm's name and its policies, in order."""
    name, _, specs = text.partition("=")
    if not name.strip() or not specs.strip():
        raise SystemExit(f"--arm {text}: give NAME=POLICY[+POLICY...] (both=llama:embedded+llama:embedded-1.5b)")
    return name.strip(), [s.strip() for s in specs.split("+") if s.strip()]


def run_arm(name: str, specs: list[str], folder: Path, work: Path, args: argparse.Namespace) -> Path:
    """`evolve run` of one arm on one problem (resumed where its archive exists); its archive's path."""
    db = work / f"{name}-{folder.name}.db"
    cmd = [sys.executable, "-m", "evolve.cli", "run", str(folder), "--db", str(db), "--sandbox", "process"]
    cmd += ["--seed", str(args.seed), "--max-time", str(args.max_time), "--max-evaluations", "1000000"]
    for spec in specs:
        cmd += ["--policy", spec]
    if len(specs) > 1:
        cmd += ["--bandit-cost", "seconds"]
    for flag in ("max_groups", "max_new_tokens", "group_size"):
        if getattr(args, flag) is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    log = work / f"{name}-{folder.name}.log"
    with log.open("a") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise SystemExit(f"{name} on {folder.name} stopped ({done.returncode}): {tail[0]} (log: {log})")
    return db


def read_run(arm: str, problem: str, db: Path) -> ArmRun:
    """What one run's archive says: its clock, its yield and its members' shares."""
    archive = Archive(db)
    try:
        runs = archive.runs()
        if len(runs) != 1:
            raise SystemExit(f"{db}: holds {len(runs)} runs, not one: give --work a folder of its own")
        [run] = runs
        specs = run_components(run)
        done = _yield.stored_yield(problem, archive, run, specs, run.state.elapsed_s, run.state.stop_reason or "")
        members = [
            {"name": m["name"], "groups": m["groups"], "improved": m["improved"]}
            for m in archive.arms(run.id, signs(specs), worst_values(specs))
            if m["kind"] == "member"
        ]
        quality, seed, best = done.yields.quality, done.seed_scalar, done.best
        return ArmRun(
            arm=arm,
            problem=problem,
            hours=run.state.elapsed_s / 3600.0,
            groups=done.groups,
            tokens=done.yields.tokens,
            evaluated=quality.evaluated,
            beats_parent=quality.beats_parent,
            new_best=quality.new_best,
            zero=quality.zero,
            best_over_seed=best / seed if best is not None and seed else None,
            members=members,
        )
    finally:
        archive.close()


def table(runs: list[ArmRun]) -> Table:
    out = Table(title="children that beat their parent, per arm and problem")
    for col in ("arm", "problem", "min", "groups", "tokens", "children", "beat parent", "/hour", "new bests",
                "zero", "best/seed", "members (groups, beat parent)"):  # fmt: skip
        out.add_column(col)
    for r in runs:
        members = (
            "; ".join(f"{m['name']}: {m['groups']}, {m['improved']}" for m in r.members) if len(r.members) > 1 else ""
        )
        out.add_row(
            r.arm, r.problem, f"{60 * r.hours:.1f}", str(r.groups), str(r.tokens), str(r.evaluated),
            str(r.beats_parent), f"{r.per_hour:.1f}", str(r.new_best), f"{r.zero}/{r.evaluated}",
            f"{r.best_over_seed:.3f}" if r.best_over_seed is not None else "-", members,
        )  # fmt: skip
    return out


def result_line(arms: list[str], runs: list[ArmRun]) -> str:
    cells, hours = [], []
    for arm in arms:
        mine = [r for r in runs if r.arm == arm]
        h, beats = sum(r.hours for r in mine), sum(r.beats_parent for r in mine)
        cells += [f"{arm}_per_hour={beats / h if h else 0.0:.2f}", f"beats_{arm}={beats}"]
        hours.append(h)
    return f"model_compare {' '.join(cells)} hours_per_arm={sum(hours) / len(hours):.2f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arm", action="append", default=None, help="NAME=POLICY[+POLICY...] (repeat; default 3 arms)")
    ap.add_argument("--problems", default="minimizer,tour_heuristic", help="comma-separated problem names")
    ap.add_argument("--max-time", type=float, default=600.0, help="seconds of search per arm and problem")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="keep the archives here (default: a temporary folder)")
    ap.add_argument("--max-groups", type=int, default=None, help="also stop after this many groups")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="cap per completion (default: the problem's)")
    ap.add_argument("--group-size", type=int, default=None, help="G (default: the problem's)")
    args = ap.parse_args(argv)
    arms = dict(parse_arm(a) for a in (args.arm or DEFAULT_ARMS))
    unknown = [p for p in args.problems.split(",") if p not in PROBLEMS]
    if unknown:
        raise SystemExit(f"--problems: no problem named {', '.join(unknown)} (have: {', '.join(sorted(PROBLEMS))})")
    work = args.work or Path(tempfile.mkdtemp(prefix="model-compare-"))
    work.mkdir(parents=True, exist_ok=True)
    runs = []
    for problem in args.problems.split(","):
        for name, specs in arms.items():
            db = run_arm(name, specs, PROBLEMS[problem], work, args)
            runs.append(read_run(name, problem, db))
            print(f"{name} on {problem}: {runs[-1].beats_parent} beat their parent in {60 * runs[-1].hours:.1f} min")
    Console(width=200).print(table(runs))
    print(result_line(list(arms), runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
