"""benchmarks/ and tests/ import nothing from each other, either way.

`lint-imports` holds the same rule (pyproject's independence contract) for the imports it can see; this test also
reads the ones it cannot: a module named by a string given to `importlib.import_module` (benchmarks.yield is
imported so, `yield` being a keyword). A test runs a benchmark as a user does, `python -m benchmarks.NAME` in a
subprocess; what both need lives in the installed package (evolve.devtools, evolve.problem.samples).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def crossings(folder: str, other: str) -> list[str]:
    """Each line of a Python file under `folder` that imports `other` (statically or by name), as path:line."""
    by_statement = re.compile(rf"^\s*(from\s+{other}(\.|\s)|import\s+{other}(\.|\s|$))")
    by_name = re.compile(rf"""import_module\(\s*["']{other}(\.|["'])""")
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if by_statement.search(line) or by_name.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return found


def test_no_test_imports_a_benchmark():
    assert crossings("tests", "benchmarks") == []


def test_no_benchmark_imports_a_test():
    assert crossings("benchmarks", "tests") == []
