"""How long the HTML report and the live dashboard's first paint take as the archive grows.

Each size gets a fresh SQLite archive bulk-filled like a long roman_numerals run (24 components, 4 islands,
groups of 4 completions with 3 answers each, 10% evaluation errors, a policy update every 10k evaluations).
Measured: `evolve report --html` end to end in-process (read, aggregate, render, write), the file's size, and
the served page's first paint: a cold server (empty cache) and a headless Chromium from navigation until
every view is drawn. The issue's budget is 10 s for the report and 2 s for the first paint at 100k programs.
Prints the table, a summary against the budgets, then the result line
`report_scale programs=N report_s=... first_paint_s=... ready_s=...` (the largest size).
Usage: python -m benchmarks.report_scale [--sizes 1000 10000 100000] [--no-browser]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import threading
import time
from array import array
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evolve.archive import Archive, code_hash
from evolve.archive.bulk import load_rows
from evolve.problem import load_problem
from evolve.report.page import write_report
from evolve.report.server import make_dashboard

KIND = "speed"
SMOKE_ARGS = ("--sizes", "200", "--no-browser")

PROBLEM = Path(__file__).resolve().parents[1] / "problems" / "roman_numerals"
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def fill(db: Path, n: int) -> None:
    """n evaluated programs with their groups, in a few bulk transactions."""
    rng = random.Random(n)
    problem = load_problem(PROBLEM)
    names = [c.name for c in problem.components]
    archive = Archive(db)
    config = {"problem": problem.config.model_dump(mode="json")}
    run = archive.create_run(problem.name, str(PROBLEM), "bench", config, 0)
    start = run.created_at
    span = timedelta(hours=12)
    versions, programs, evaluations, prompts, completions, variants = [], [], [], [], [], []
    skill = [0.1] * len(names)
    completion_id = variant_id = prompt_id = 0
    for i in range(1, n + 1):
        at = start + span * (i / n)
        if i == 1 or i % 10_000 == 0:
            versions.append(
                dict(
                    id=len(versions) + 1,
                    run_id=run.id,
                    number=len(versions),
                    base_model="bench",
                    created_at=at,
                    stats=None if i == 1 else {"loss": rng.random(), "kl": 0.01},
                )
            )
        parent = rng.randrange(1, i) if i > 1 else None
        code = f"def solve(n):\n    program = {i}\n    return {'X' * rng.randrange(1, 300)!r}\n"
        programs.append(
            dict(
                id=i,
                run_id=run.id,
                code=code,
                code_hash=code_hash(code),
                parent_id=parent,
                island=i % 4,
                generation=i.bit_length(),
                created_at=at,
            )
        )
        failed = rng.random() < 0.1
        skill = [min(1.0, s + 0.00002 * rng.random()) for s in skill]
        scores = {name: float(rng.random() < s) for name, s in zip(names, skill, strict=True)}
        evaluations.append(
            dict(
                program_id=i,
                scores={} if failed else scores,
                scalar=None if failed else sum(scores.values()) / len(scores),
                error_kind=rng.choice(["crash", "timeout", "invalid"]) if failed else None,
                duration_s=rng.random(),
                sandbox="process",
                created_at=at + timedelta(seconds=1),
            )
        )
        if parent is not None and i % 6 == 0:  # one group (4 completions x 3 answers) per 6 children
            prompt_id += 1
            prompts.append(
                dict(
                    id=prompt_id,
                    run_id=run.id,
                    parent_id=parent,
                    inspiration_ids=[],
                    island=i % 4,
                    text="prompt",
                    created_at=at,
                )
            )
            for g in range(4):
                completion_id += 1
                tokens = array("i", range(rng.randrange(100, 400))).tobytes()
                completions.append(
                    dict(
                        id=completion_id,
                        prompt_id=prompt_id,
                        policy_version_id=len(versions),
                        sampling={},
                        text="completion",
                        token_ids=tokens,
                        created_at=at,
                    )
                )
                for k in range(3):
                    variant_id += 1
                    j = 3 * g + k  # the first six answers made the six children i-5..i
                    status = "ok" if j < 6 else rng.choice(["duplicate", "parse_error", "unchanged"])
                    variants.append(
                        dict(
                            id=variant_id,
                            completion_id=completion_id,
                            slot=k,
                            status=status,
                            program_id=i - 5 + j if j < 6 else None,
                        )
                    )
    load_rows(
        archive,
        [
            ("policy_versions", versions),
            ("programs", programs),
            ("evaluations", evaluations),
            ("prompts", prompts),
            ("completions", completions),
            ("variants", variants),
        ],
    )
    archive.close()


@dataclass
class Served:
    warm_cpu: float  # the server's first aggregation (done before it listens), CPU seconds
    contentful: float | None = None  # the browser's first-contentful-paint (the run summary), seconds
    chart: float | None = None  # navigation until the best-score curves are drawn, wall seconds
    chart_cpu: float | None = None  # Chromium main-thread CPU (CDP ThreadTime) at that moment
    ready: float | None = None  # every view drawn (they follow one per task), wall seconds


def served(db: Path, browser: bool = True) -> Served:
    """A cold browser against a warmed server. Renderer CPU is reported beside wall time because a loaded
    shared machine inflates wall time several-fold; without Chromium (or `browser` False) only the warm-up is
    measured."""
    archive = Archive(db, create=False)
    started = time.process_time()
    server = make_dashboard(archive, archive.runs()[-1].id, "127.0.0.1", 0)
    warm = time.process_time() - started
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return Served(warm)
    if not browser or not Path(CHROMIUM).exists():
        server.shutdown()
        archive.close()
        return Served(warm)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            cdp = page.context.new_cdp_session(page)
            cdp.send("Performance.enable")
            started = time.perf_counter()
            page.goto(f"http://127.0.0.1:{server.server_port}/", wait_until="commit")
            page.wait_for_selector("body[data-first-paint=true]", timeout=300_000)
            out = Served(warm, chart=time.perf_counter() - started)
            metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
            out.chart_cpu = metrics.get("ThreadTime")
            out.contentful = page.evaluate("performance.getEntriesByName('first-contentful-paint')[0].startTime / 1000")
            page.wait_for_selector("body[data-ready=true]", timeout=300_000)
            out.ready = time.perf_counter() - started
            browser.close()
    finally:
        server.shutdown()
        archive.close()
    return out


def seconds(value: float | None) -> str:
    return "n/a (no Chromium)" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10_000, 100_000])
    parser.add_argument("--no-browser", action="store_true", help="measure the server's warm-up only, no Chromium")
    args = parser.parse_args()
    table = Table(
        "programs",
        "report wall s",
        "report CPU s",
        "MB",
        "server warm-up CPU s",
        "first contentful paint s",
        "first chart wall s",
        "first chart renderer CPU s",
        "all views s",
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.sizes:
            db = Path(tmp) / f"bench_{n}.db"
            fill(db, n)
            archive = Archive(db, create=False)
            wall, cpu = time.perf_counter(), time.process_time()
            html = write_report(archive, archive.runs()[-1])
            (Path(tmp) / "report.html").write_text(html)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            archive.close()
            page = served(db, browser=not args.no_browser)
            results.append((n, wall, cpu, page))
            table.add_row(
                f"{n:,}",
                f"{wall:.2f}",
                f"{cpu:.2f}",
                f"{len(html) / 1e6:.1f}",
                f"{page.warm_cpu:.2f}",
                seconds(page.contentful),
                seconds(page.chart),
                seconds(page.chart_cpu),
                seconds(page.ready),
            )
    Console().print(table)
    load = os.getloadavg()[0]
    n, wall, cpu, page = results[-1]
    print(
        f"summary: at {n:,} programs the HTML report takes {wall:.2f} s wall / {cpu:.2f} s CPU (budget 10 s); the "
        f"served page paints in {seconds(page.contentful)} s and draws its first chart in {seconds(page.chart)} s "
        f"wall / {seconds(page.chart_cpu)} s renderer CPU (budget 2 s); load {load:.1f} on {os.cpu_count()} CPUs"
    )
    paint, ready = seconds(page.contentful), seconds(page.ready)
    print(f"report_scale programs={n} report_s={wall:.2f} first_paint_s={paint} ready_s={ready}")


if __name__ == "__main__":
    main()
