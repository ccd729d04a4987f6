"""`evolve init`: a small, working split-form problem to start from, in Python, C or Rust."""

from __future__ import annotations

from pathlib import Path

from evolve.problem.config import plain_name
from evolve.problem.scaffold_native import TEMPLATES, native_sections

LANGUAGES = ("python", *TEMPLATES)
PYTHON_PROGRAM = """[program]
file = "seed.py"
entry_point = "solve"
"""
# `--files`: the same problem as a program of two files, each with a block (a start for [program] files).
PYTHON_FILES_PROGRAM = """[program]
files = ["seed.py", "helpers.py"]
entry_point = "solve"
"""
FILES_SEED = '''import math

from helpers import scale


# EVOLVE-BLOCK-START
def solve(x):
    """Return an estimate of f(x)."""
    return scale() * x
# EVOLVE-BLOCK-END
'''
FILES_HELPER = '''"""What the solver in seed.py builds on; its block may change too."""


# EVOLVE-BLOCK-START
def scale():
    """A factor the solver applies."""
    return 1.0
# EVOLVE-BLOCK-END
'''
SOLVE = {
    "python": "solve(x) receives one float x and returns a float.",
    "c": "The program is C: its solve(x) receives one double x and returns a double.",
    "rust": "The program is Rust: its solve(x) receives one f64 x and returns an f64.",
}

PROBLEM_TOML = '''name = "{name}"
description = """
Approximate the hidden function f(x) as closely as possible. {solve}
Each test point is one fitness component scored 1 / (1 + |error|), so 1.0 is exact.
"""

{program}
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


def scaffold(target: Path, language: str = "python", several_files: bool = False) -> list[Path]:
    """Write the template in `language` into `target` (which must be empty or absent); returns the files written.
    `several_files`: the Python template as a program of two files (seed.py imports helpers.py)."""
    if language not in LANGUAGES:
        raise ValueError(f"--language {language!r}: not one of {', '.join(LANGUAGES)}")
    if several_files and language != "python":
        raise ValueError(f"--files: only with --language python (a {language} build lists its files itself)")
    if target.exists() and any(target.iterdir()):
        raise FileExistsError(f"{target}: not empty; pick a new folder")
    program, seed_name, seed = (PYTHON_PROGRAM, "seed.py", SEED) if language == "python" else native_sections(language)
    if several_files:
        program, seed = PYTHON_FILES_PROGRAM, FILES_SEED
    target.mkdir(parents=True, exist_ok=True)
    files = {
        "problem.toml": PROBLEM_TOML.format(name=plain_name(target.name), solve=SOLVE[language], program=program),
        seed_name: seed,
        "evaluate.py": EVALUATE.format(),
    }
    if several_files:
        files["helpers.py"] = FILES_HELPER
    written = []
    for name, body in files.items():
        path = target / name
        path.write_text(body)
        written.append(path)
    return written
