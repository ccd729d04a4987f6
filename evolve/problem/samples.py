"""Small problem folders written on the fly, shared by the tests and the benchmarks.

A split-form problem with two cases (`c0`: 2 -> 4, `c1`: 3 -> 9) whose seed squares its input, so every
sandbox scores it (1.0, 1.0); the caller swaps in its own seed, evaluator or `problem.toml`. The square problem
(`write_square_problem`) is that one posed as the tiny test model was taught it, with answers to replay.
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


# The square problem: the seed adds one where it should square; full rewrites, two variants per completion.
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
    """The problem the tiny test model was taught to answer, in the folder `root`."""
    return write_problem(root, seed=SQUARE_SEED, toml=SQUARE_TOML)


def full_answer(*bodies: str) -> str:
    """One completion whose variants are these bodies, whole (the square problem asks for full rewrites)."""
    return "".join(f"<variant {i}>\n```python\n{b}```\n</variant {i}>\n" for i, b in enumerate(bodies, start=1))
