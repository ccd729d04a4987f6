"""What recording the candidate's swallowed errors costs an evaluation (issue #59), on the shipped problems.

The harness records what the candidate's code raises into the evaluator's (sandboxes/escapes.py, `EscapeLog`):
in the split form only in its own exception handlers, in the simple (OpenEvolve) form by watching the candidate's
module as the evaluator imports it (its functions, as the evaluator gets them, run through a wrapper). A job
without `candidate_files` records nothing: that is "before" here, the same sandbox and harness otherwise.

For each problem in problems/ and benchmarks/problems/, and each OpenEvolve folder of tests/openevolve_folders
(the simple form: no shipped problem uses it), the seed is evaluated in the process sandbox `--n` times with
recording and `--n` times without, interleaved so that a busy machine slows both alike. A second simple-form row
per folder evaluates a child that raises in every call (what is recorded then, and its price). A last row, not
counted in the result line, is the simple form's worst case: an evaluator calling a tiny candidate function 100k
times (each call pays the watched module's attribute read and the wrapper).

Prints a table (median ms per evaluation before and after, the difference, what was recorded) and the result
line `error_capture_cost problems=N median_delta_pct=... max_delta_ms=... hot_loop_delta_ms=... call_ns_before=...
after=...`.

Usage: python -m benchmarks.error_capture_cost [--n 20] [--only NAME]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import sandboxes.process as process_module
from evolve.problem import Problem, load_problem
from evolve.problem.errors import ProblemError
from evolve.problem.openevolve import load_openevolve
from sandboxes.process import ProcessSandbox
from sandboxes.scoring import make_job

KIND = "speed"
SMOKE_ARGS = ("--n", "1", "--only", "roman_numerals")
ROOT = Path(__file__).resolve().parents[1]
FOLDERS = [
    *sorted(p for p in (ROOT / "problems").iterdir() if (p / "problem.toml").is_file()),
    *sorted(p for p in (ROOT / "benchmarks" / "problems").iterdir() if (p / "problem.toml").is_file()),
    *sorted(p for p in (ROOT / "tests" / "openevolve_folders").iterdir() if (p / "evaluator.py").is_file()),
]
# Not shipped: the worst case of the simple form, an evaluator that calls a small candidate function in a hot loop
# (FunSearch's `priority(item, bins)` style); each call pays the watched module's read and wrapper.
HOT_LOOP_CALLS = 100_000
HOT_LOOP_EVALUATOR = f"""
import importlib.util


def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("program", program_path)
    program = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(program)
    total = sum(program.priority(i) for i in range({HOT_LOOP_CALLS}))
    return {{"combined_score": 1.0 if total < 0 else 0.0}}
"""
HOT_LOOP_SEED = "# EVOLVE-BLOCK-START\ndef priority(item):\n    return -item\n# EVOLVE-BLOCK-END\n"
# An OpenEvolve folder's child that raises on every call (tests/openevolve_folders: `solve(x)` should be x * x).
RAISING = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return fooo * x\n# EVOLVE-BLOCK-END\n"


@contextmanager
def recording(on: bool) -> Iterator[None]:
    """The process sandbox's jobs with the candidate's files named (recording) or not (nothing recorded)."""

    def job_without_files(*args: Any, **kwargs: Any) -> dict[str, Any]:
        job = make_job(*args, **kwargs)
        job.pop("candidate_files", None)
        return job

    process_module.make_job = make_job if on else job_without_files  # type: ignore[assignment]
    try:
        yield
    finally:
        process_module.make_job = make_job  # type: ignore[assignment]


def timed(box: ProcessSandbox, problem: Problem, code: str, on: bool) -> tuple[float, int, str | None]:
    """(ms, distinct errors recorded, error kind) of one evaluation."""
    with recording(on):
        start = time.perf_counter()
        outcome = box.evaluate(problem, code)
        ms = (time.perf_counter() - start) * 1000
    return ms, sum(e.count for e in outcome.swallowed), outcome.error_kind


def row(box: ProcessSandbox, problem: Problem, code: str, n: int) -> dict[str, Any]:
    timed(box, problem, code, True)  # warm-up (a native problem's toolchain, the page cache)
    before, after, recorded, kinds = [], [], 0, set()
    for _ in range(n):
        for on, into in ((False, before), (True, after)):
            ms, count, kind = timed(box, problem, code, on)
            into.append(ms)
            recorded = count if on else recorded
            kinds.add(kind or "ok")
    b, a = statistics.median(before), statistics.median(after)
    return {
        "before": b,
        "after": a,
        "delta_ms": a - b,
        "delta_pct": 100 * (a - b) / b,
        "recorded": recorded,
        "kinds": ",".join(sorted(kinds)),
    }


def call_cost(calls: int = 200_000) -> tuple[float, float]:
    """(ns per call of a candidate's function as the evaluator gets it, unwatched; watched): the simple form's
    price per call, measured in this process on the harness's own watcher, without a sandbox's noise."""
    import importlib.util
    import tempfile

    from sandboxes import escapes  # the sandbox's own module, stdlib only

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "candidate.py")
        path.write_text("def solve(x):\n    return x * x\n")
        results = []
        for watch in (False, True):
            if watch:
                escapes.watch_candidate_imports(escapes.EscapeLog([str(path)]))
            spec = importlib.util.spec_from_file_location(f"candidate_{watch}", path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            start = time.perf_counter()
            for x in range(calls):
                module.solve(x)
            results.append((time.perf_counter() - start) * 1e9 / calls)
    return results[0], results[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="evaluations per row and condition")
    ap.add_argument("--only", default=None, help="only the problem folder of this name")
    args = ap.parse_args()
    box = ProcessSandbox(slots=1)
    table = Table(title=f"per-evaluation time, process sandbox, median of {args.n} (ms)")
    for col in ("problem", "form", "program", "before", "after", "delta ms", "delta %", "recorded", "outcome"):
        table.add_column(col)
    rows: list[dict[str, Any]] = []
    hot_rows: list[dict[str, Any]] = []  # the worst case, apart from the shipped problems' figures
    scratch = tempfile.TemporaryDirectory()
    hot = Path(scratch.name, f"hot_loop_{HOT_LOOP_CALLS // 1000}k_calls")
    hot.mkdir()
    (hot / "initial_program.py").write_text(HOT_LOOP_SEED)
    (hot / "evaluator.py").write_text(HOT_LOOP_EVALUATOR)
    try:
        for folder in [*FOLDERS, hot]:
            if args.only and folder.name != args.only:
                continue
            try:
                problem = (
                    load_problem(folder)
                    if (folder / "problem.toml").is_file()
                    else load_openevolve(folder, lambda p: box.evaluate(p, p.seed_code))[0]
                )
            except ProblemError as exc:  # a toolchain this machine lacks (rustc): say so, measure the rest
                table.add_row(folder.name, "-", "-", "-", "-", "-", "-", "-", f"skipped: {str(exc)[:60]}")
                continue
            programs = [("seed", problem.seed_code)]
            if problem.form != "split":
                programs.append(("raising child", RAISING))
            for label, code in programs:
                r = row(box, problem, code, args.n)
                (rows if folder != hot else hot_rows).append(r)
                table.add_row(
                    folder.name,
                    problem.form,
                    label,
                    f"{r['before']:.1f}",
                    f"{r['after']:.1f}",
                    f"{r['delta_ms']:+.1f}",
                    f"{r['delta_pct']:+.1f}",
                    str(r["recorded"]),
                    r["kinds"],
                )
    finally:
        box.close()
        scratch.cleanup()
    Console(width=200).print(table)
    bare, watched = call_cost()
    print(
        f"a candidate function called by the evaluator (module.solve(x)): {bare:.0f} ns unwatched, "
        f"{watched:.0f} ns watched (+{watched - bare:.0f} ns per call)"
    )
    if not rows and not hot_rows:
        raise SystemExit(f"no problem folder named {args.only!r} was measured")
    deltas = [r["delta_pct"] for r in rows] or [0.0]
    hot = f" hot_loop_delta_ms={hot_rows[0]['delta_ms']:+.1f}" if hot_rows else ""
    print(
        f"error_capture_cost problems={len(rows)} median_delta_pct={statistics.median(deltas):+.2f} "
        f"max_delta_ms={max((r['delta_ms'] for r in rows), default=0.0):+.1f}{hot} "
        f"call_ns_before={bare:.0f} after={watched:.0f}"
    )


if __name__ == "__main__":
    main()
