"""Evaluations per second and latency of the sandboxes on a trivial candidate, beside bare process spawning.

Usage: python -m benchmarks.sandbox_throughput [--n 60] [--workers 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evolve.problem import load_problem
from evolve.problem.samples import write_problem
from sandboxes.docker_pool import DockerSandbox, docker_available
from sandboxes.process import ProcessSandbox

TRIVIAL = "def solve(x):\n    return x * x\n"


def measure(fn: Callable[[], object], n: int, workers: int) -> tuple[float, float, float]:
    """(evals/s over `workers` threads, median ms, p90 ms)."""
    latencies: list[float] = []

    def one(_: int) -> None:
        t = time.perf_counter()
        fn()
        latencies.append((time.perf_counter() - t) * 1000)

    fn()  # warm-up
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, range(n)))
    wall = time.perf_counter() - start
    q = statistics.quantiles(latencies, n=10)
    return n / wall, statistics.median(latencies), q[8]


def cold_run(problem: object) -> None:
    """What a naive Docker backend does: a fresh container per evaluation."""
    import docker

    from sandboxes.docker_images import image_for

    client = docker.from_env()
    spec = image_for(client, problem)  # type: ignore[arg-type]
    volumes = {h: {"bind": c, "mode": "ro"} for h, c in spec.binds.items()}
    client.containers.run(
        spec.tag, [spec.python, "-I", "-c", "print(4)"], network_mode="none", remove=True, volumes=volumes
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    problem = load_problem(write_problem(Path(tempfile.mkdtemp()) / "bench"))
    process = ProcessSandbox(slots=args.workers)
    example = load_problem(Path(__file__).resolve().parents[1] / "problems" / "bin_packing")
    rows: dict[str, tuple[float, float, float]] = {
        "bare subprocess.run(python -c pass)": measure(
            lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), args.n, args.workers
        ),
        "process sandbox, trivial candidate": measure(lambda: process.evaluate(problem, TRIVIAL), args.n, args.workers),
        "process sandbox, bin_packing seed": measure(
            lambda: process.evaluate(example, example.seed_code), args.n // 2, args.workers
        ),
    }
    if docker_available() is None:
        for mode, spawn in (("fork", False), ("spawn", True)):
            pool = DockerSandbox(workers=args.workers, spawn=spawn)
            rows[f"docker warm pool ({mode}), trivial candidate"] = measure(
                lambda pool=pool: pool.evaluate(problem, TRIVIAL), args.n, args.workers
            )
            rows[f"docker warm pool ({mode}), bin_packing seed"] = measure(
                lambda pool=pool: pool.evaluate(example, example.seed_code), args.n // 2, args.workers
            )
            pool.close()
        rows["docker cold run per evaluation"] = measure(lambda: cold_run(problem), max(args.n // 4, 10), 1)
    table = Table(title=f"sandbox throughput ({args.n} evaluations, {args.workers} workers)")
    for col in ("backend", "evals/s", "median ms", "p90 ms"):
        table.add_column(col, justify="right" if col != "backend" else "left")
    for name, (eps, med, p90) in rows.items():
        table.add_row(name, f"{eps:.1f}", f"{med:.1f}", f"{p90:.1f}")
    Console().print(table)
    base = rows["bare subprocess.run(python -c pass)"]
    proc = rows["process sandbox, trivial candidate"]
    print(f"sandbox=process evals_per_s={proc[0]:.1f} median_ms={proc[1]:.1f} baseline_evals_per_s={base[0]:.1f}")
    if "docker cold run per evaluation" in rows:
        warm, cold = rows["docker warm pool (fork), trivial candidate"], rows["docker cold run per evaluation"]
        print(
            f"sandbox=docker evals_per_s={warm[0]:.1f} median_ms={warm[1]:.1f} process_evals_per_s={proc[0]:.1f} "
            f"cold_evals_per_s={cold[0]:.1f}"
        )


if __name__ == "__main__":
    main()
