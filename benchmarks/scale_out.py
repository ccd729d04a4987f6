"""Where does one engine saturate? Evaluations per second against the number of evaluation slots.

Every evaluation sleeps a fixed time instead of running code (an async sleep, as a Ray actor's evaluation
looks to the engine: no thread held per slot) and the policy replays distinct completions at once, so the
rate is slots / delay until the engine itself (selection, prompts, parsing and the single committer) is the
limit. Measured with SQLite and with PostgreSQL (a throw-away local cluster, as the tests make). The Ray
overhead is the mean round trip of an instant evaluation through a local Ray actor minus the same call in
process. Prints a line per point, the table, each database's ceiling, then the result line
`scale_out sqlite_ceiling_evals_per_s=... postgres_ceiling_evals_per_s=... ray_overhead_ms=...`.
Usage: python -m benchmarks.scale_out [--slots 1 2 4 ... 256] [--delay 0.05] [--no-ray] [--no-postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from benchmarks.engine_overhead import SEED, InstantSandbox, completions
from evolve.archive import Archive
from evolve.loop import SearchLoop, run_search
from evolve.options import RunOptions
from evolve.problem import Problem, load_problem
from evolve.problem.outcome import EvalOutcome
from evolve.problem.samples import write_problem
from evolve.runs import open_run
from policies.replay import ReplayPolicy

KIND = "speed"
SMOKE_ARGS = ("--slots", "2", "--delay", "0.01", "--seconds", "0.2", "--no-postgres", "--no-ray")


class SleepSandbox:
    """An evaluation that takes `delay` seconds of wall time and no CPU: a simulated remote slot."""

    kind = "sleep"

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.rng = random.Random(0)

    def isolation(self) -> str:
        return "none (benchmark)"

    def _outcome(self, problem: Problem) -> EvalOutcome:
        return EvalOutcome({c.name: self.rng.random() for c in problem.components}, None, None, self.delay, self.kind)

    async def aevaluate(self, problem: Problem, code: str) -> EvalOutcome:
        await asyncio.sleep(self.delay)
        return self._outcome(problem)

    def evaluate(self, problem: Problem, code: str) -> EvalOutcome:
        time.sleep(self.delay)
        return self._outcome(problem)

    def close(self) -> None:
        pass


def rate(url: str, slots: int, delay: float, evaluations: int) -> tuple[float, float]:
    """Evaluations per second of one run with `slots` evaluations in flight, and the engine process's CPU
    milliseconds per evaluation (all its threads; a database server's own CPU is not counted). The CPU figure
    hardly moves with the machine's load, so it compares runs made on a busy machine."""
    folder = Path(tempfile.mkdtemp())
    problem = load_problem(write_problem(folder / "p", seed=SEED))
    archive = Archive(url)
    options = RunOptions(workers=slots, group_size=8, variants=4, max_evaluations=evaluations, edit_format="full")
    run = open_run(archive, problem, options).run
    policy = ReplayPolicy(completions(evaluations // 4 + 64, 4))
    loop = SearchLoop(problem, archive, policy, SleepSandbox(delay), run, options)
    t0, cpu0 = time.perf_counter(), time.process_time()
    run_search(loop)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    archive.close()
    done = loop.stats.session_evaluations
    return done / wall, 1000 * cpu / max(done, 1)


def ray_overhead_ms(calls: int = 200) -> float:
    """Mean extra milliseconds per evaluation through a local Ray actor, against the same call in process."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from sandboxes.ray_pool import RaySandbox

    folder = Path(tempfile.mkdtemp())
    problem = load_problem(write_problem(folder / "p", seed=SEED))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    try:
        sandbox = RaySandbox(None, slots=1, cpus_per_actor=0, make_local=InstantSandbox)
        sandbox.evaluate(problem, SEED)  # ships the problem once
        t0 = time.perf_counter()
        for _ in range(calls):
            sandbox.evaluate(problem, SEED)
        remote = (time.perf_counter() - t0) / calls
        local = InstantSandbox()
        t1 = time.perf_counter()
        for _ in range(calls):
            local.evaluate(problem, SEED)
        sandbox.close()
        return (remote - (time.perf_counter() - t1) / calls) * 1000
    finally:
        ray.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256])
    ap.add_argument("--delay", type=float, default=0.05, help="seconds per simulated evaluation")
    ap.add_argument("--seconds", type=float, default=4.0, help="aim for about this long per point")
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()
    databases: dict[str, object] = {"sqlite": None}
    cluster = None
    if not args.no_postgres:
        from evolve.devtools.postgres_cluster import PostgresCluster

        cluster = PostgresCluster.start()
        databases["postgres"] = cluster
    table = Table(title=f"evaluations per second, each evaluation {args.delay * 1000:.0f} ms (simulated slots)")
    table.add_column("slots", justify="right")
    table.add_column("ideal", justify="right")
    for name in databases:
        table.add_column(f"{name} evals/s", justify="right")
        table.add_column(f"{name} cpu ms/eval", justify="right")
    best: dict[str, tuple[float, int]] = {name: (0.0, 0) for name in databases}
    rows: dict[int, list[str]] = {}
    try:
        for slots in args.slots:
            ideal = slots / args.delay
            evaluations = int(min(3000, max(60, min(ideal, 800) * args.seconds)))
            rows[slots] = [str(slots), f"{ideal:.0f}"]
            for name, server in databases.items():
                url = str(Path(tempfile.mkdtemp()) / "a.db") if server is None else server.new_database("bench")
                r, cpu_ms = rate(url, slots, args.delay, evaluations)
                if r > best[name][0]:
                    best[name] = (r, slots)
                rows[slots] += [f"{r:.0f}", f"{cpu_ms:.2f}"]
                load = os.getloadavg()[0]
                print(f"  {name} {slots} slots: {r:.0f} evals/s, {cpu_ms:.2f} cpu ms/eval, load {load:.1f}", flush=True)
    finally:
        if cluster is not None:
            cluster.stop()
    for row in rows.values():
        table.add_row(*row)
    Console().print(table)
    for name, (r, slots) in best.items():
        print(f"{name}: ceiling {r:.0f} evals/s, first reached at {slots} slots")
    print(f"machine load (1-min average) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    overhead = math.nan if args.no_ray else ray_overhead_ms()
    pg = best.get("postgres", (math.nan, 0))[0]
    print(
        f"scale_out sqlite_ceiling_evals_per_s={best['sqlite'][0]:.0f} postgres_ceiling_evals_per_s={pg:.0f} "
        f"ray_overhead_ms={overhead:.2f}"
    )


if __name__ == "__main__":
    main()
