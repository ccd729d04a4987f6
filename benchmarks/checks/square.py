"""The square problem and answers to it, for the checks that run benchmarks' own code on a real tiny run.

A copy of the tests' square problem (tests/helpers.py) and of tests/test_loop_parts.py's answers: benchmarks and
tests import nothing from each other (pyproject's import contract), so the few lines both need are written twice.
"""

from __future__ import annotations

from pathlib import Path

from evolve.problem.samples import write_problem

SQUARE_SEED = """# EVOLVE-BLOCK-START
def solve(x):
    return x + 1
# EVOLVE-BLOCK-END
"""

SQUARE_TOML = """
name = "square"
description = "Square the input."
[program]
file = "seed.py"
[fitness]
components = [{ name = "c0", bounds = [0.0, 1.0] }, { name = "c1", bounds = [0.0, 1.0] }]
[limits]
timeout_s = 5
memory_mb = 512
[search]
islands = 2
migration_interval = 4
group_size = 4
variants = 2
edit_format = "full"
temperature = 0.7
max_new_tokens = 160
"""

SQUARE = "def solve(x):\n    return x * x\n"  # scores (1, 1) on the square problem
FOUR = "def solve(x):\n    return 4\n"  # scores (1, 0)


def write_square_problem(root: Path) -> Path:
    return write_problem(root, seed=SQUARE_SEED, toml=SQUARE_TOML)


def answer(*bodies: str) -> str:
    """One completion whose variants are these bodies, whole (the square problem asks for full rewrites)."""
    return "".join(f"<variant {i}>\n```python\n{b}```\n</variant {i}>\n" for i, b in enumerate(bodies, start=1))
