"""Runs left alone: a slow case fails alone, and the failures of a parent and its children reach the next prompt."""

from __future__ import annotations

import json

import pytest

from evolve.archive import Archive
from evolve.problem import load_problem
from evolve.prompts import PromptInputs, build_prompt
from sandboxes.process import ProcessSandbox
from tests.helpers import SPLIT_EVAL, SPLIT_TOML, write_problem
from tests.unattended_runs import evolve

pytestmark = pytest.mark.slow


SLOW_CASE_EVAL = SPLIT_EVAL.replace(
    'return [{"name": "c0", "input": 2, "expected": 4}, {"name": "c1", "input": 3, "expected": 9}]',
    'return [{"name": "c0", "input": 2, "expected": 4}, {"name": "c1", "input": -1, "expected": 1}]',
)
SLOW_CASE_SEED = """
# EVOLVE-BLOCK-START
def solve(x):
    while x < 0:
        pass
    return x * x
# EVOLVE-BLOCK-END
"""


def test_case_timeout_fails_the_slow_case_alone(tmp_path):
    toml = SPLIT_TOML.format(name="slow", timeout=20) + "case_timeout_s = 0.5\n"
    problem = load_problem(write_problem(tmp_path / "p", seed=SLOW_CASE_SEED, evaluate=SLOW_CASE_EVAL, toml=toml))
    sandbox = ProcessSandbox(slots=1)
    try:
        outcome = sandbox.evaluate(problem, problem.seed_code)
    finally:
        sandbox.close()
    assert outcome.error_kind is None and outcome.scores == {"c0": 1.0, "c1": 0.0}
    assert set(outcome.case_errors) == {"c1"} and "0.5" in outcome.case_errors["c1"]
    assert outcome.duration_s < 10  # not the whole evaluation's 20 s


def test_failures_and_case_errors_reach_the_next_prompt(tmp_path):
    """A parent's failed cases and its children's failures are stored and shown to the model."""
    toml = SPLIT_TOML.format(name="slow", timeout=20) + "case_timeout_s = 0.5\n"
    folder = write_problem(tmp_path / "p", seed=SLOW_CASE_SEED, evaluate=SLOW_CASE_EVAL, toml=toml)
    crash = (
        "<variant 1>\n```python\ndef solve(x):\n    raise RuntimeError('negative input: ' + str(x))\n```\n</variant 1>"
    )
    replay = tmp_path / "r.json"
    replay.write_text(json.dumps([crash]))
    db = tmp_path / "d.db"
    out = evolve(
        "run", str(folder), "--db", str(db), "--policy", f"replay:{replay}", "--sandbox", "process",
        "--max-evaluations", "2", "--variants", "1", "--group-size", "1", "--edit-format", "full",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    archive = Archive(db, create=False)
    run = archive.runs()[0]
    seed_id = min(p.id for p in archive.evaluation_rows(run) for p in [p[0]])
    context = archive.parent_context(seed_id)
    assert context.case_errors is not None and "c1" in context.case_errors
    failures = archive.recent_child_failures(seed_id)
    assert failures and failures[0].kind == "crash" and "negative input" in failures[0].error
    archive.close()
    prompt = build_prompt(
        PromptInputs(
            "d", SLOW_CASE_SEED, {"c0": 1.0, "c1": 0.0}, None, [], 1, "full",
            parent_case_errors=context.case_errors, recent_failures=failures,
        )
    )  # fmt: skip
    assert "Cases it failed:" in prompt and "- c1: case exceeded 0.5s" in prompt
    assert "crash: every case failed; first: RuntimeError: negative input" in prompt
    shown = evolve("show", str(db), str(seed_id))
    assert "case c1 failed: case exceeded 0.5s" in shown.stdout, shown.stdout
