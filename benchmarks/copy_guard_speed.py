"""The copy guard's own cost per token, by the length of the row (policies/copy_guard.py).

A row writes, one character per token, a copy of a long known code (the guard's busiest case: every token is
judged against it), and the guard's bookkeeping for each token (`write`, then `rests`) is timed. Before the row's
view was kept as it goes, each token read the whole row again: 341, 1,568 and 2,991 µs per token at 1,000, 5,000
and 10,000 tokens on this project's 2-core machine (both cores busy with a search), quadratic in all; kept as it
goes, 52, 47 and 52 µs at 1,000, 5,000 and 20,000 tokens, flat. A row of one long line (`one-line`) still cost
148, 648 and 1,302 µs a token at 1,000, 5,000 and 10,000 (its unfinished line read again at every token); read as it
goes, 22 µs at each length up to 20,000, as the rows of many lines (2026-12-06, both cores busy with the study).

Usage: python -m benchmarks.copy_guard_speed [--lengths 1000,5000,20000]
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from policies.copy_guard import GroupGuard, RowGuard, TokenTexts

KIND = "speed"
SMOKE_ARGS = ("--lengths", "200")


def known_code(chars: int) -> str:
    """A Python function at least `chars` long, one statement per line, inside its body throughout."""
    lines, k = ["def solve(x):"], 0
    while sum(map(len, lines)) < chars:
        lines.append(f"    x = x * {k % 7 + 2} + {k}  # step {k}")
        k += 1
    return "\n".join(lines) + "\n    return x\n"


def one_line_code(chars: int) -> str:
    """A Python function whose body is one line at least `chars` long (a long literal, or a model that never
    ends its line): the unfinished line is what the guard compares at every token."""
    terms = " + ".join(f"x * {k % 7 + 2}" for k in range(chars // 8 + 1))
    return f"def solve(x):\n    return {terms}\n"


def seconds_for(length: int, shape: str = "lines") -> float:
    known = known_code(length) if shape == "lines" else one_line_code(length)
    code = known[:length]
    guard = RowGuard(GroupGuard.of([known], "#"), TokenTexts([]))
    guard.write("<variant 1>\n```python\n")
    started = time.perf_counter()
    for ch in code:
        guard.write(ch)
        guard.rests()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1000,5000,20000")
    args = parser.parse_args()
    table = Table(title="copy guard: bookkeeping per token (write + rests), one character per token")
    for column in ("row", "tokens", "total s", "µs / token"):
        table.add_column(column, justify="right")
    figures = []
    for shape in ("lines", "one-line"):
        for length in (int(x) for x in args.lengths.split(",")):
            total = seconds_for(length, shape)
            figures.append(f"us_per_token_{shape.replace('-', '_')}_{length}={total / length * 1e6:.1f}")
            table.add_row(shape, str(length), f"{total:.3f}", f"{total / length * 1e6:.1f}")
    Console().print(table)
    print("copy_guard_speed " + " ".join(figures))


if __name__ == "__main__":
    main()
