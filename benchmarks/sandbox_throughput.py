"""Evaluations per second and latency of the sandboxes on a trivial candidate, beside bare process spawning.

Every Docker row (warm pools and the cold baseline, which starts a fresh container per evaluation) uses the
same runner, limits and worker count. With `--load N`, N CPU-bound processes stay busy while the key rows are
measured again, as when a policy generates on the same machine.

Prints a table (evaluations/s, median and p90 latency per backend), then the result line
`sandbox_throughput sandbox=process evals_per_s=... median_ms=... baseline_evals_per_s=...` and, with Docker,
`sandbox_throughput sandbox=docker ...` (warm pool against the process sandbox, the cold baseline and bare spawning).
Smoke size: 2 evaluations a row on one worker, Docker left out (`--no-docker`).

Usage: python -m benchmarks.sandbox_throughput [--n 60] [--workers 2] [--load N] [--no-docker]
"""

from __future__ import annotations

import argparse
import multiprocessing
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
from sandboxes.sandbox import Sandbox, SandboxRefused

KIND = "speed"
SMOKE_ARGS = ("--n", "2", "--workers", "1", "--no-docker")
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


def _spin() -> None:
    while True:
        pass


def busy(n: int) -> list[multiprocessing.Process]:
    """N processes that keep a core each busy until terminated."""
    procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    return procs


BARE = "bare subprocess.run(python -c pass)"
JAIL = "process sandbox (bubblewrap, files hidden), trivial candidate"
WEAK = "process sandbox (WEAK, no jail), trivial candidate"
WARM = "docker warm pool (fork), trivial candidate"
COLD = "docker cold: fresh container per evaluation, same runner"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--load", type=int, default=0, help="CPU-bound processes kept busy for the loaded rows")
    ap.add_argument("--no-docker", action="store_true", help="leave the Docker rows out")
    args = ap.parse_args()
    problem = load_problem(write_problem(Path(tempfile.mkdtemp()) / "bench"))
    example = load_problem(Path(__file__).resolve().parents[1] / "problems" / "bin_packing")
    process = ProcessSandbox(slots=args.workers)
    try:
        weak: ProcessSandbox | None = ProcessSandbox(slots=args.workers, jail=False)
    except SandboxRefused as exc:  # as root without an interpreter other uids can reach: no WEAK row
        print(f"no WEAK row: {exc}")
        weak = None
    bare: Callable[[], object] = lambda: subprocess.run([sys.executable, "-c", "pass"], check=True)  # noqa: E731
    trivial: dict[str, Callable[[], object]] = {BARE: bare}
    if process.hides_files:
        trivial[JAIL] = lambda: process.evaluate(problem, TRIVIAL)
    if weak is not None:
        trivial[WEAK] = lambda: weak.evaluate(problem, TRIVIAL)
    rows = {name: measure(fn, args.n, args.workers) for name, fn in trivial.items()}
    rows["process sandbox, bin_packing seed"] = measure(
        lambda: process.evaluate(example, example.seed_code), max(args.n // 2, 2), args.workers
    )
    pools: list[Sandbox] = []
    if not args.no_docker and docker_available() is None:
        for mode, spawn in (("fork", False), ("spawn", True)):
            pool = DockerSandbox(workers=args.workers, spawn=spawn)
            pools.append(pool)
            rows[f"docker warm pool ({mode}), trivial candidate"] = measure(
                lambda pool=pool: pool.evaluate(problem, TRIVIAL), args.n, args.workers
            )
            rows[f"docker warm pool ({mode}), bin_packing seed"] = measure(
                lambda pool=pool: pool.evaluate(example, example.seed_code), max(args.n // 2, 2), args.workers
            )
            if not spawn:
                trivial[WARM] = lambda pool=pool: pool.evaluate(problem, TRIVIAL)
        cold = DockerSandbox(workers=args.workers, recycle_every=1)
        pools.append(cold)
        rows[COLD] = measure(lambda: cold.evaluate(problem, TRIVIAL), max(args.n // 4, 10), args.workers)
    if args.load:
        spinners = busy(args.load)
        try:
            for name, fn in trivial.items():
                rows[f"{name} (load {args.load})"] = measure(fn, args.n, args.workers)
        finally:
            for proc in spinners:
                proc.terminate()
    for box in (process, *([weak] if weak is not None else []), *pools):
        box.close()
    table = Table(title=f"sandbox throughput ({args.n} evaluations, {args.workers} workers, python {sys.prefix})")
    for col in ("backend", "evals/s", "median ms", "p90 ms"):
        table.add_column(col, justify="right" if col != "backend" else "left")
    for name, (eps, med, p90) in rows.items():
        table.add_row(name, f"{eps:.1f}", f"{med:.1f}", f"{p90:.1f}")
    Console().print(table)
    base = rows[BARE]
    # The jail's row when there is one, else WEAK's (as root WEAK is refused and has no row: not looked up then)
    process_row = JAIL if JAIL in rows else WEAK
    proc = rows[process_row]
    print(
        f"sandbox_throughput sandbox=process evals_per_s={proc[0]:.1f} median_ms={proc[1]:.1f} "
        f"baseline_evals_per_s={base[0]:.1f}"
    )
    if COLD in rows:
        warm, cold_row = rows[WARM], rows[COLD]
        print(
            f"sandbox_throughput sandbox=docker evals_per_s={warm[0]:.1f} median_ms={warm[1]:.1f} "
            f"process_evals_per_s={proc[0]:.1f} cold_evals_per_s={cold_row[0]:.1f} "
            f"warm_over_bare={warm[0] / base[0]:.1f}x"
        )
    if args.load and COLD in rows:
        loaded = {name: rows[f"{name} (load {args.load})"][0] for name in (WARM, process_row, BARE)}
        print(
            f"sandbox_throughput load={args.load} docker_evals_per_s={loaded[WARM]:.1f} "
            f"process_evals_per_s={loaded[process_row]:.1f} baseline_evals_per_s={loaded[BARE]:.1f}"
        )


if __name__ == "__main__":
    main()
