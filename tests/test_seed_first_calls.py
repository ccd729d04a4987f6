"""The seed's first calls (issue #59): while the problem's own seed is evaluated, the sandbox records the first call
of each function of its editable code that its fixed code calls, with the real arguments; the archive keeps it with
the seed's evaluation alone, and a prompt that names the interface (`interface_reminder`) shows it. Shown one real
call of `priority` (one job's dict), the embedded model's children beat their parent 1.5 times as often per token on
job_priority (docs/yield.md). No other program's reply is believed: a child that forges the record is stored
without one, and the prompt shows the seed's.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.archive import Archive
from evolve.cli import app
from evolve.problem import load_problem
from evolve.problem.openevolve import load_openevolve
from evolve.problem.outcome import FIRST_CALLS_CAP
from tests.helpers import hiding_sandbox, write_problem

JOB_PRIORITY = Path(__file__).resolve().parent.parent / "benchmarks" / "problems" / "job_priority"
FIRST_JOB = "priority({'time': 11, 'urgent': False, 'due': 272})"  # the instance's first job, keys in its order
SEED_SCORES = {"flow": 0.5029, "urgent": 0.441, "tardiness": 0.4179}  # rounded: the seed keeps the given order

# An OpenEvolve folder whose fixed code calls the block's function with one case's dict.
SEED = """# EVOLVE-BLOCK-START
def step(case):
    return case["x"] + 1
# EVOLVE-BLOCK-END


def solve(x):
    return step({"x": x, "tag": "case"}) * step({"x": x, "tag": "again"})
"""
SEED_CALL = "step({'x': 0, 'tag': 'case'})"
EVALUATOR = """
import importlib.util


def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("candidate", program_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    right = sum(module.solve(x) == (x + 1) * (x + 1) for x in range(4))
    exact = sum(module.solve(x) == x * x for x in range(4))
    return {"combined_score": exact / 4, "right": right / 4}
"""
EXACT = 'def step(case):\n    return case["x"]\n'  # solve(x) == x * x
# A child that makes the harness say it recorded a call, as a seed's reply would: stored without it.
FORGER = (
    "import sys\n"
    "for _m in list(sys.modules.values()):\n"
    "    if hasattr(_m, 'NoCalls'):\n"
    "        _m.NoCalls.entries = lambda self: [\"step('forged by a child')\"]\n"
    'def step(case):\n    return case["x"] + 2\n'
)


def _in_block(body: str) -> str:
    return SEED.replace('def step(case):\n    return case["x"] + 1\n', body)


def _completion(*codes: str) -> str:
    return "".join(f"<variant {k}>\n```python\n{c}```\n</variant {k}>\n" for k, c in enumerate(codes, start=1))


@pytest.fixture(scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request):
    box = hiding_sandbox(request.param, 2)
    yield box
    box.close()


def test_the_seed_s_evaluation_records_its_first_call_and_no_other_program_s_does(sandbox):
    problem = load_problem(JOB_PRIORITY)
    seed = sandbox.evaluate(problem, problem.seed_code)
    assert seed.first_calls == [FIRST_JOB]
    assert {k: round(v, 4) for k, v in seed.scores.items()} == SEED_SCORES
    child = sandbox.evaluate(problem, problem.seed_code.replace("return 0", "return job['time']"))
    assert child.first_calls == []  # not asked: the record is the seed's alone
    assert child.scores["flow"] == 1.0 and child.error_kind is None  # shortest first is optimal for the flow


# Nine functions the fixed code calls, one of them defined in two blocks: more than a reply may carry.
MANY = (
    "# EVOLVE-BLOCK-START\n"
    + "".join(f"def f{i}(x):\n    return x\n\n\n" for i in range(9))
    + "# EVOLVE-BLOCK-END\n\n# EVOLVE-BLOCK-START\ndef f0(x, y=0):\n    return x\n# EVOLVE-BLOCK-END\n\n\n"
    + "def solve(x):\n    return ("
    + " + ".join(f"f{i}(x)" for i in range(9))
    + ") // 9\n"
)


def test_a_seed_calling_more_functions_than_a_reply_carries_is_scored_as_before(sandbox, tmp_path):
    problem = load_problem(write_problem(tmp_path / "many", seed=MANY))
    seed = sandbox.evaluate(problem, problem.seed_code)
    assert (seed.error_kind, seed.scores) == (None, {"c0": 0.0, "c1": 0.0})  # solve(x) = x, the cases want x * x
    assert seed.first_calls == [f"f{i}(2)" for i in range(FIRST_CALLS_CAP)]


@pytest.mark.slow
@pytest.mark.parametrize("sandbox_kind", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_a_run_stores_the_seed_s_first_call_and_the_next_prompt_shows_it_never_a_child_s(tmp_path, sandbox_kind):
    if sandbox_kind == "docker":
        hiding_sandbox("docker", 1).close()  # a skip (a failure in CI) when no daemon answers
    folder = tmp_path / "called"
    folder.mkdir()
    (folder / "initial_program.py").write_text(SEED)
    (folder / "evaluator.py").write_text(EVALUATOR)
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([_completion(FORGER), _completion(EXACT)]))
    db = tmp_path / "run.db"
    args = ["run", str(folder), "--db", str(db), "--policy", f"replay:{replay}", "--sandbox", sandbox_kind]
    args += ["--workers", "1", "--group-size", "1", "--variants", "1", "--max-evaluations", "3"]
    args += ["--edit-format", "full", "--no-stop-when-solved", "--stall-groups", "1000", "--interface-reminder"]
    ran = CliRunner().invoke(app, args, catch_exceptions=False)
    assert ran.exit_code == 0, ran.stdout + ran.stderr

    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT p.code, p.parent_id, e.scores, e.first_calls FROM programs p "
            "JOIN evaluations e ON e.program_id = p.id ORDER BY p.id"
        ).fetchall()
        prompts = [text for (text,) in con.execute("SELECT text FROM prompts ORDER BY id")]

    def which(code: str, parent: int | None) -> str:
        return "seed" if parent is None else "forger" if "forged" in code else "exact"

    stored = {
        which(code, parent): (json.loads(scores), calls and json.loads(calls)) for code, parent, scores, calls in rows
    }
    assert stored == {
        "seed": ({"combined_score": 0.0, "right": 1.0}, [SEED_CALL]),
        "forger": ({"combined_score": 0.0, "right": 0.0}, None),  # its record dropped, its scores its own
        "exact": ({"combined_score": 1.0, "right": 0.0}, None),
    }
    said = "It calls `step(case)` from the editable code: every variant must define it, with this name and these "
    said += f"parameters. Evaluating the seed, it made the call `{SEED_CALL}`."
    assert len(prompts) >= 2 and all(said in p for p in prompts)
    assert not any("forged by a child" in p.split("# Current program")[0] for p in prompts)
    shown = CliRunner().invoke(app, ["show", str(db), "1"], catch_exceptions=False)
    assert shown.exit_code == 0 and f"first call: {SEED_CALL}" in shown.stdout, shown.stdout


def test_an_archive_of_the_previous_version_upgrades_and_its_seed_shows_no_call(tmp_path):
    from tests.helpers import downgrade_archive, square_run, store_program

    _, archive, run, _ = square_run(tmp_path)
    evaluation = {"scores": {"c0": 0.0}, "scalar": 0.0, "duration_s": 1, "first_calls": ["solve(3)"]}
    store_program(archive, run.id, _in_block(EXACT), evaluation=evaluation)
    assert archive.seed_first_calls(run.id) == ["solve(3)"]
    archive.close()
    downgrade_archive(tmp_path / "a.db", "0008_issue59")
    with sqlite3.connect(tmp_path / "a.db") as con:
        assert "first_calls" not in {row[1] for row in con.execute("PRAGMA table_info(evaluations)")}
    archive = Archive(tmp_path / "a.db")
    try:
        assert archive.seed_first_calls(run.id) == []
    finally:
        archive.close()


# An evaluator that holds the function, calls it (once raising), pickles it and inspects it: what it sees of the
# seed must be what it sees of any program (a recorder handed to it had broke pickling and hid the exception).
HOLDING_SEED = """# EVOLVE-BLOCK-START
def step(case):
    return 1 / case["x"]
# EVOLVE-BLOCK-END


def solve(x):
    return step({"x": x})
"""
HOLDING_EVALUATOR = """
import importlib.util, inspect, pickle, sys


def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("held", program_path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["held"] = module
    spec.loader.exec_module(module)
    f = module.step
    failed = 0
    for x in (0, 2):
        try:
            f({"x": x})
        except ZeroDivisionError:
            failed += 1
    module.solve(4)
    pickle.dumps(f)
    plain = inspect.isfunction(f) and f.__code__.co_argcount == 1 and "solve" in f.__globals__
    return {"combined_score": 1.0 - failed / 2, "plain": float(plain)}
"""


def test_what_an_evaluator_holding_the_function_sees_of_the_seed_is_what_it_sees_of_any_program(sandbox, tmp_path):
    folder = tmp_path / "holding"
    folder.mkdir()
    (folder / "initial_program.py").write_text(HOLDING_SEED)
    (folder / "evaluator.py").write_text(HOLDING_EVALUATOR)
    problem, _ = load_openevolve(folder, lambda p: sandbox.evaluate(p, p.seed_code))
    seed = sandbox.evaluate(problem, problem.seed_code)
    twin = sandbox.evaluate(problem, problem.seed_code + "\n")  # the same program, not the seed: nothing asked
    assert (
        (seed.error_kind, seed.scores)
        == (twin.error_kind, twin.scores)
        == (None, {"combined_score": 0.5, "plain": 1.0})
    )
    assert [e.as_dict() | {"file": None} for e in seed.swallowed] == [
        e.as_dict() | {"file": None} for e in twin.swallowed
    ]
    assert [(e.type, e.count) for e in seed.swallowed] == [("ZeroDivisionError", 1)]
    assert (seed.first_calls, twin.first_calls) == (["step({'x': 4})"], [])  # the fixed code's call
