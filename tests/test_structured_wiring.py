"""`--structured` reaches the policy: a group asks a policy that holds answers to their shape (StructuredSampling)
for the shape its prompt asked (m, edit format, the prompt's fence tag, the lead comment), asks one that cannot for
free text, and `off` asks none; the group's stored sampling says which, and its stored prompt asks for the lead
comment exactly when the shape holds it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from evolve.loop import SearchLoop, run_search
from evolve.prompts import completion_budget
from policies.answer_grammar import AnswerShape
from policies.policy import Generated
from sandboxes.process import ProcessSandbox
from tests.helpers import square_run

ANSWER = "<variant 1>\n```python\ndef solve(x):\n    return x * x + {k}\n```\n</variant 1>\n"


class Recording:
    """Answers with a new program each call and keeps the sampling each call asked for."""

    name, version, max_concurrency = "recording", 0, 1

    def __init__(self) -> None:
        self.asked: list[AnswerShape | None] = []
        self.budgets: list[int] = []

    def generate(self, prompt, params, n):
        self.asked.append(params.structured)
        self.budgets.append(params.max_new_tokens)
        k = len(self.asked)
        return [Generated(ANSWER.format(k=k * 10 + i), None, None, "stop", 0) for i in range(n)]

    def close(self) -> None:
        pass


class Holding(Recording):
    structured_formats = ("full", "diff")  # policies.policy.StructuredSampling


def run_to_end(problem, archive, policy, run, options) -> None:
    """The search loop over `run` on the process sandbox until it stops, its sandbox and archive then closed."""
    loop = SearchLoop(problem, archive, policy, ProcessSandbox(slots=1), run, options)
    try:
        run_search(loop)
    finally:
        loop.sandbox.close()
        archive.close()


@pytest.mark.parametrize(
    ("policy_class", "mode", "lead", "asked"),
    [
        (Holding, "auto", True, AnswerShape(1, "full", "python", "#")),
        (Holding, "on", True, AnswerShape(1, "full", "python", "#")),
        (Holding, "auto", False, AnswerShape(1, "full", "python")),
        (Holding, "off", True, None),
        (Recording, "auto", True, None),
    ],
)
def test_a_group_asks_for_the_answer_s_shape_where_the_policy_can_hold_it(tmp_path, policy_class, mode, lead, asked):
    problem, archive, run, options = square_run(
        tmp_path, group_size=1, variants=1, max_evaluations=3, max_groups=2, workers=1, structured=mode,
        lead_comment=lead, max_new_tokens=400,
    )  # fmt: skip
    policy = policy_class()
    run_to_end(problem, archive, policy, run, options)
    assert policy.asked and all(a == asked for a in policy.asked), policy.asked
    # a held answer cannot run on past its last variant: it gets the held room (evolve/prompts/builder.py)
    budget = completion_budget(problem.seed_code, 1, "full", options.max_new_tokens, held=asked is not None)
    assert policy.budgets[0] == budget == (176 if asked is not None else 160)  # 128 + 48 held; the floor free
    stored = [json.loads(s) for (s,) in sqlite3.connect(tmp_path / "a.db").execute("SELECT sampling FROM completions")]
    assert [s["structured"] for s in stored] == [None if asked is None else {**vars(asked), "files": []}] * len(stored)
    prompts = [p for (p,) in sqlite3.connect(tmp_path / "a.db").execute("SELECT text FROM prompts")]
    said = "first line of each fenced block is a comment, `# Change: ...`"
    assert prompts and all((said in p) == bool(asked and asked.lead_comment) for p in prompts)


class HoldingTree(Holding):
    """Answers a program of several files: one section, a header and that file's edit."""

    def generate(self, prompt, params, n):
        self.asked.append(params.structured)
        value = 0.6 + 0.05 * len(self.asked)
        edit = f"<<<<<<< SEARCH\n    return 0.6\n=======\n    return {value:.2f}\n>>>>>>> REPLACE\n"
        text = f"<variant 1>\n=== FILE: lib/params.py ===\n{edit}</variant 1>"
        return [Generated(text, None, None, "stop", 0) for _ in range(n)]


def test_a_program_of_several_files_asks_for_headers_of_the_files_it_may_change(tmp_path):
    """knapsack_files: the shape names lib/params.py and lib/ranking.py (not the fixed solver.py); the stored
    sampling says so, and the held answers become children."""
    from evolve.archive import Archive
    from evolve.options import RunOptions
    from evolve.problem import load_problem
    from evolve.runs import open_run

    problem = load_problem(Path(__file__).resolve().parents[1] / "problems" / "knapsack_files")
    archive = Archive(tmp_path / "a.db")
    options = RunOptions(
        workers=1, group_size=1, variants=1, max_evaluations=3, max_groups=2, structured="on", asks="base", seed=0
    )
    policy = HoldingTree()
    run_to_end(problem, archive, policy, open_run(archive, problem, options).run, options)
    files = ("lib/params.py", "lib/ranking.py")
    assert policy.asked and all(a is not None and a.files == files for a in policy.asked), policy.asked
    db = sqlite3.connect(tmp_path / "a.db")
    stored = [json.loads(s)["structured"] for (s,) in db.execute("SELECT sampling FROM completions")]
    assert stored and all(s["files"] == list(files) for s in stored)
    assert [s for (s,) in db.execute("SELECT status FROM variants")] == ["ok"] * len(policy.asked)
