"""The split form's trusted `cases()` and `score()` get no credential of the engine's environment (issue #57,
verification round).

They are the problem author's code, run on the host in the engine's own processes (evolve/problem/trusted.py):
they must read the hidden answers, so no jail hides the user's files from them, and a problem folder is code
you run. But the engine had handed them its whole environment, so a folder from elsewhere read the
`OPENAI_API_KEY` that a server it names is refused (evolve/problem/seed_files.py, `--trust-problem-urls`).
Here `cases()` and `score()` report what they see as numbers of the score vector: exact values, not a message.
"""

from __future__ import annotations

import pytest

from evolve.problem import load_problem
from evolve.problem.samples import GOOD_SEED, write_problem
from tests.helpers import hiding_sandbox

CREDENTIALS = {
    "OPENAI_API_KEY": "sk-scorer-test",
    "EVOLVE_API_KEY": "ev-scorer-test",
    "HF_TOKEN": "hf-scorer-test",
    "AWS_SECRET_ACCESS_KEY": "aws-scorer-test",
    "PGPASSWORD": "pg-scorer-test",
}
# c0: how many credentials cases() saw; c1: how many score() saw; c2: a plain variable score() still sees.
COUNTING_EVAL = f"""
import os

NAMES = {sorted(CREDENTIALS)!r}

def seen():
    return sum(1 for name in NAMES if name in os.environ)

def cases():
    return [{{"name": "c0", "input": 2, "n": seen()}}, {{"name": "c1", "input": 2}}, {{"name": "c2", "input": 2}}]

def score(case, output):
    if case["name"] == "c0":
        return float(case["n"])
    if case["name"] == "c1":
        return float(seen())
    return 1.0 if os.environ.get("EVOLVE_SCORER_PLAIN") == "kept" else 0.0
"""
TOML = """
name = "env"
description = "counts the credentials its evaluator sees"
[program]
file = "seed.py"
[evaluator]
file = "evaluate.py"
[limits]
timeout_s = 5
[fitness]
components = [
  { name = "c0", bounds = [0, 9] }, { name = "c1", bounds = [0, 9] }, { name = "c2", bounds = [0, 1] },
]
"""


@pytest.mark.parametrize("kind", ["process", "docker"])
def test_cases_and_score_see_no_credential_of_the_engine(tmp_path, monkeypatch, kind):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("EVOLVE_SCORER_PLAIN", "kept")
    folder = write_problem(tmp_path / "p", seed=GOOD_SEED, evaluate=COUNTING_EVAL, toml=TOML)
    problem = load_problem(folder)
    sandbox = hiding_sandbox(kind, 1)
    try:
        outcome = sandbox.evaluate(problem, problem.seed_code)
    finally:
        sandbox.close()
    assert outcome.scores == {"c0": 0.0, "c1": 0.0, "c2": 1.0}, (outcome.error, outcome.feedback)
