"""What the code hash costs per new text, before local names counted (a parse and an unparse) and now (with the
canonical renaming), on each shipped problem's seed; and, given archives, how many of their stored programs
the current normalisation finds equal to an older one of the same run (variants it would have caught).

Usage: python -m benchmarks.code_hash [--repeat 300] [--db A.db ...]
"""

from __future__ import annotations

import argparse
import ast
import sqlite3
import statistics
import time
from pathlib import Path

from evolve.archive.codehash import normalize, normalized_hash

KIND = "speed"
SMOKE_ARGS = ("--repeat", "3")

ROOT = Path(__file__).resolve().parent.parent


def layout_only(code: str) -> str:
    """The normalisation before local names counted (version 1)."""
    return ast.unparse(ast.parse(code))


def per_call_us(normalise, code: str, repeat: int) -> float:
    """The median of `repeat` single calls, in microseconds (the memo is not involved: each call parses)."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        normalise(code)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def merged_programs(db: Path) -> tuple[int, int]:
    """(programs, programs equal under the current normalisation to an older program of their run)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute("SELECT run_id, code FROM programs ORDER BY id").fetchall()
    seen: set[tuple[int, str]] = set()
    merged = 0
    for run_id, code in rows:
        key = (run_id, normalized_hash(code))
        merged += key in seen
        seen.add(key)
    return len(rows), merged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--db", type=Path, nargs="*", default=[])
    args = parser.parse_args()
    seeds = sorted([*ROOT.glob("problems/*/seed.py"), *ROOT.glob("benchmarks/problems/*/seed.py")])
    before_all, after_all = [], []
    for seed in seeds:
        code = seed.read_text()
        renamed = normalize(code) != layout_only(code)
        before, after = per_call_us(layout_only, code, args.repeat), per_call_us(normalize, code, args.repeat)
        before_all.append(before)
        after_all.append(after)
        print(
            f"{seed.parent.name:16} {len(code.splitlines()):4} lines  before {before:7.0f} us  after {after:7.0f} us"
            f"  x{after / before:.2f}  {'renamed' if renamed else 'left as written'}"
        )
    print(f"code_hash before={statistics.mean(before_all):.0f}us after={statistics.mean(after_all):.0f}us per new text")
    for db in args.db:
        total, merged = merged_programs(db)
        print(f"{db}: {merged} of {total} stored programs equal an older one up to local names")


if __name__ == "__main__":
    main()
