"""Small problem folders written on the fly, shared by the tests and the benchmarks.

A split-form problem with two cases (`c0`: 2 -> 4, `c1`: 3 -> 9) whose seed squares its input, so every
sandbox scores it (1.0, 1.0); the caller swaps in its own seed, evaluator or `problem.toml`.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

SPLIT_TOML = """
name = "{name}"
description = "test problem"
[program]
file = "seed.py"
entry_point = "solve"
[fitness]
components = [{{ name = "c0", bounds = [0.0, 1.0] }}, {{ name = "c1", bounds = [0.0, 1.0] }}]
[limits]
timeout_s = {timeout}
memory_mb = 512
max_processes = 32
"""

# score() echoes what the candidate returned into the feedback, so tests can see what happened inside.
SPLIT_EVAL = """
def cases():
    return [{"name": "c0", "input": 2, "expected": 4}, {"name": "c1", "input": 3, "expected": 9}]

def score(case, output):
    return (1.0 if output == case["expected"] else 0.0), repr(output)[:2000]
"""

GOOD_SEED = """
# EVOLVE-BLOCK-START
def solve(x):
    return x * x
# EVOLVE-BLOCK-END
"""


def write_problem(
    root: Path,
    *,
    seed: str = GOOD_SEED,
    evaluate: str = SPLIT_EVAL,
    toml: str | None = None,
    timeout: float = 3.0,
    name: str = "t",
    program_file: str = "seed.py",
) -> Path:
    """The folder `root` with `problem.toml`, the seed (as `program_file`: what the toml's `[program] file`
    names, `prog.c` for a C problem) and `evaluate.py`."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "problem.toml").write_text(toml if toml is not None else SPLIT_TOML.format(name=name, timeout=timeout))
    (root / program_file).write_text(textwrap.dedent(seed))
    (root / "evaluate.py").write_text(textwrap.dedent(evaluate))
    return root
