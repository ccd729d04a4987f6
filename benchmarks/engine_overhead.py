"""Per-child engine cost (selection + prompt + parse + archive writes) as the archive grows.

The policy replays recorded completions and the evaluator returns at once, so the wall time per child is
the engine's own overhead. Archives are prefilled with N evaluated programs first.
Usage: python -m benchmarks.engine_overhead [--sizes 1000 10000 100000] [--children 600]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evolve.archive import Archive, code_hash
from evolve.archive.bulk import load_rows
from evolve.loop import SearchLoop, run_search
from evolve.options import RunOptions
from evolve.problem import Problem, load_problem
from evolve.problem.outcome import EvalOutcome
from evolve.problem.samples import write_problem
from evolve.runs import open_run
from policies.replay import ReplayPolicy

KIND = "speed"
SMOKE_ARGS = ("--sizes", "100", "--children", "20")

SEED = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return x * x\n# EVOLVE-BLOCK-END\n"


class InstantSandbox:
    """Scores every program at once with a random vector: isolates the engine's cost from evaluation."""

    kind = "instant"

    def __init__(self) -> None:
        self.rng = random.Random(0)

    def isolation(self) -> str:
        return "none (benchmark)"

    def evaluate(self, problem: Problem, code: str) -> EvalOutcome:
        return EvalOutcome({c.name: self.rng.random() for c in problem.components}, None, None, 0.0, self.kind)

    def close(self) -> None:
        pass


def completions(count: int, m: int) -> list[str]:
    """Distinct completions, each with m distinct full-rewrite variants."""
    return [
        "".join(
            f"<variant {k}>\n```python\ndef solve(x):\n    return x * {i * m + k}\n```\n</variant {k}>\n"
            for k in range(1, m + 1)
        )
        for i in range(count)
    ]


def prefill(archive: Archive, run_id: int, n: int, names: list[str], islands: int) -> None:
    rng = random.Random(1)
    programs = [
        dict(
            id=i + 1,
            run_id=run_id,
            code=f"x = {i}\n",
            code_hash=code_hash(f"x = {-i - 1}\n"),
            parent_id=None,
            island=i % islands,
            generation=1,
        )
        for i in range(n)
    ]
    evaluations = [
        dict(
            program_id=i + 1,
            scores={c: rng.random() for c in names},
            scalar=rng.random(),
            error_kind=None,
            duration_s=0.0,
            sandbox="instant",
        )
        for i in range(n)
    ]
    load_rows(archive, [("programs", programs), ("evaluations", evaluations)])


def measure(size: int, children: int) -> tuple[float, float]:
    """(engine ms per child, index rebuild seconds) at an archive of `size` programs."""
    folder = Path(tempfile.mkdtemp())
    problem = load_problem(write_problem(folder / "p", seed=SEED))
    archive = Archive(folder / "a.db")
    options = RunOptions(workers=2, group_size=4, variants=3, max_evaluations=size + children, edit_format="full")
    run = open_run(archive, problem, options).run
    prefill(archive, run.id, size, problem.component_names, problem.config.search.islands)
    loop = SearchLoop(problem, archive, ReplayPolicy(completions(children, 3)), InstantSandbox(), run, options)
    spent: dict[str, float] = {}
    replay = loop.ledger.replay

    def timed_replay(*args: object) -> None:  # the run's own replay, timed where it happens, out of the wall time
        t0 = time.perf_counter()
        replay(*args)  # type: ignore[arg-type]
        spent["rebuild"] = time.perf_counter() - t0

    loop.ledger.replay = timed_replay  # type: ignore[method-assign]
    t1 = time.perf_counter()
    run_search(loop)  # rebuilds its index first, then makes `children` children
    rebuild = spent["rebuild"]
    wall = time.perf_counter() - t1 - rebuild
    made = loop.stats.session_evaluations
    archive.close()
    return wall / max(made, 1) * 1000, rebuild


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000, 100000])
    ap.add_argument("--children", type=int, default=600)
    args = ap.parse_args()
    table = Table(title=f"engine overhead per child ({args.children} children, instant policy and evaluator)")
    for col in ("archive size", "ms per child", "index rebuild s"):
        table.add_column(col, justify="right")
    results = {}
    for size in args.sizes:
        per_child, rebuild = measure(size, args.children)
        results[size] = per_child
        table.add_row(f"{size:,}", f"{per_child:.2f}", f"{rebuild:.2f}")
    Console().print(table)
    label = {1000: "1k", 10000: "10k", 100000: "100k"}
    print("engine_overhead ms_per_child " + " ".join(f"{label.get(s, s)}={v:.2f}" for s, v in results.items()))


if __name__ == "__main__":
    main()
