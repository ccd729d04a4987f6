"""The programs and the evaluator the tests of swallowed errors (issue #59) share: tests/test_swallowed_errors.py
(what is recorded, stored and shown) and tests/test_swallowed_errors_attacks.py (what no candidate can flood, forge
or break). One place, so that both judge the same evaluator and the same honest programs."""

from __future__ import annotations

from pathlib import Path

from evolve.problem import Problem, load_problem
from tests.helpers import simple_form_toml, write_problem

SEED = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return x + 1\n# EVOLVE-BLOCK-END\n"
# Swallows every exception the program raises, case by case, and says nothing of it: the pattern of issue #59.
SILENT_EVALUATOR = """
import importlib.util


def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("candidate", program_path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:
        return {"combined_score": 0.0, "close": 0.0}
    right = close = 0
    for x in range(6):
        try:
            got = module.solve(x)
            right += got == x * x
            close += abs(got - x * x) <= 2
        except Exception:
            pass
    return {"combined_score": right / 6, "close": close / 6}
"""
BROKEN = "def solve(x):\n    return fooo * x\n"  # NameError on line 3 of the program (the block's second line)
HALF_BROKEN = "def solve(x):\n    if x % 2:\n        return [][x]\n    return x * x\n"  # IndexError on odd x: 3 times
EXACT = "def solve(x):\n    return x * x\n"
NAME_ERROR_LINE = "NameError: name 'fooo' is not defined (line 3, 6 times) at `return fooo * x`"

# The candidate's own module object, as the evaluator's import made it (not in sys.modules).
OWN_MODULE = """import gc, types

def _me():
    return next(m for m in gc.get_referrers(globals()) if isinstance(m, types.ModuleType))

"""

SIMPLE_TOML = simple_form_toml(("combined_score", "close"), timeout_s=10)


def simple_form_problem(root: Path) -> Problem:
    """The simple-form problem whose evaluator swallows every exception of the program (SILENT_EVALUATOR)."""
    return load_problem(write_problem(root, seed=SEED, evaluate=SILENT_EVALUATOR, toml=SIMPLE_TOML))
