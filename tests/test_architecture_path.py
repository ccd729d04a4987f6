"""docs/architecture.md's path of one child is what the profiler sees (tests/path_trace.py), not a hand count: a
new crossing, or one gone, fails here until the table is printed again (`python -m tests.path_trace`)."""

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


def test_no_stage_calls_the_ledger_the_loop_or_another_stage():
    """One writer: the ledger is applied by the loop alone, and a stage hands records back instead of calling on."""
    path = child_path()
    stages = ("evolve.group_sampler", "evolve.evaluation", "evolve.commit")
    crossings = {(c.caller, c.callee) for c in path}
    assert not {(a, b) for a, b in crossings if a in stages and b in (*stages, "evolve.ledger", "evolve.loop")}
    assert {a for a, b in crossings if b == "evolve.ledger"} == {"evolve.loop", "evolve.flow"}
