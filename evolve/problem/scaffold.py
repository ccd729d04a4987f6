"""`evolve init`: a small, working split-form problem to start from."""

from __future__ import annotations

from pathlib import Path

PROBLEM_TOML = '''name = "{name}"
description = """
Approximate the hidden function f(x) as closely as possible. solve(x) receives one float x and returns a
float. Each test point is one fitness component scored 1 / (1 + |error|), so 1.0 is exact.
"""

[program]
file = "seed.py"
entry_point = "solve"

[evaluator]
file = "evaluate.py"

[fitness]
cases = 8
case_prefix = "x"
bounds = [0.0, 1.0]

[limits]
timeout_s = 10
memory_mb = 512
'''

SEED = '''import math

# EVOLVE-BLOCK-START
def solve(x):
    """Return an estimate of f(x)."""
    return x
# EVOLVE-BLOCK-END
'''

EVALUATE = '''"""Split form: cases() lists the inputs; score() runs outside the sandbox, with the hidden answers."""

import math


def cases():
    points = [0.5 * i - 1.5 for i in range(8)]
    return [
        {{"name": f"x_{{i:03d}}", "input": x, "expected": x * math.sin(x) + 1.0}}
        for i, x in enumerate(points)
    ]


def score(case, output):
    value = float(output)
    if not math.isfinite(value):
        return 0.0, "non-finite output"
    return 1.0 / (1.0 + abs(value - case["expected"]))
'''


def scaffold(target: Path) -> list[Path]:
    """Write the template into `target` (which must be empty or absent); returns the files written."""
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target}: not empty; pick a new folder")
    target.mkdir(parents=True, exist_ok=True)
    files = {
        "problem.toml": PROBLEM_TOML.format(name=target.name),
        "seed.py": SEED,
        "evaluate.py": EVALUATE.format(),
    }
    written = []
    for name, body in files.items():
        path = target / name
        path.write_text(body)
        written.append(path)
    return written
