"""docs/architecture.md's path of one child is what the profiler sees (tests/path_trace.py), not a hand count: a
new crossing, or one gone, fails here until the table is printed again (`python -m tests.path_trace`).

This keeps the doc's table true and nothing more. The rule that only the ledger writes run state is read from the
code's syntax by tests/test_ledger_writers.py: a trace sees only the calls one small run happens to make, and it
subtracts a seed-only run, so a crossing made equally often in both drops out of it.
"""

from __future__ import annotations

import re

from tests.path_trace import ROOT, child_path, table


def documented() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    found = re.search(r"<!-- path-of-one-child:start -->\n(.*?)\n<!-- path-of-one-child:end -->", text, re.S)
    assert found, "docs/architecture.md lost its path-of-one-child markers"
    return found.group(1).strip()


def test_the_documented_path_of_one_child_is_the_traced_one():
    traced = table(child_path())
    assert documented() == traced, f"docs/architecture.md is out of date; its table is now:\n{traced}"
