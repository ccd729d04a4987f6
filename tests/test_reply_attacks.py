"""Replies and evaluators that used to stop a run (red-team findings 4 and 7 of issue #57; 5 is in
tests/test_score_deadlines.py).

- A lone surrogate (what Python makes of undecodable bytes) in a candidate's error or an evaluator's feedback made
  every commit fail: it is now stored as a visible escape, and no prompt carries it.
- A candidate that forges its harness's reply (a `kind` that is a list, a number where text is due, NaN, missing
  keys) made the trusted scorer raise, an engine failure that stopped the run: every malformed reply is now the
  child's `bad_output`, in the process and the Docker sandbox alike.

After every attack, honest programs are scored in the same sandbox or run and their exact vectors asserted.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from evolve.problem import load_problem
from evolve.problem.outcome import ErrorKind
from policies.replay import ReplayPolicy
from tests.helpers import (
    KNOWN,
    assert_known_vectors,
    db_rows,
    evolve_run_cmd,
    hiding_sandbox,
    simple_form_toml,
    write_problem,
)

TWO_CASES = (
    'def cases():\n    return [{"name": "c0", "input": 2, "expected": 4}, {"name": "c1", "input": 3, "expected": 9}]\n'
)
# score() puts the output itself into its feedback: a surrogate the candidate returns reaches the notes as it is.
ECHO_EVAL = TWO_CASES + (
    '\ndef score(case, output):\n    return (1.0 if output == case["expected"] else 0.0), "got " + str(output)\n'
)


def raising(k: int) -> str:
    """A candidate whose every case raises an error holding a lone surrogate (undecodable bytes, decoded)."""
    return f"def solve(x):\n    raise ValueError(b'bad \\xff byte {k}'.decode('utf-8', 'surrogateescape'))\n"


SURROGATE_OUTPUT = "def solve(x):\n    return b'\\xfeok'.decode('utf-8', 'surrogateescape')\n"


def assert_storable(outcome) -> None:
    """Every text of an outcome is valid UTF-8 (no lone surrogate left)."""
    texts = [outcome.error or "", outcome.feedback or "", outcome.stdout, outcome.stderr]
    texts += [text for pair in outcome.case_errors.items() for text in pair]
    for text in texts:
        text.encode("utf-8")


@pytest.fixture(scope="module", params=["process", "docker"])
def sandbox(request):
    box = hiding_sandbox(request.param, 2)
    yield box
    box.close()


@pytest.fixture(scope="module")
def echo_problem(tmp_path_factory):
    return load_problem(write_problem(tmp_path_factory.mktemp("echo"), evaluate=ECHO_EVAL))


# ---- finding 4: lone surrogates ------------------------------------------------------------------------------


def test_a_lone_surrogate_in_a_reply_comes_back_as_a_visible_escape(sandbox, echo_problem):
    outcome = sandbox.evaluate(echo_problem, raising(1))
    assert outcome.error_kind == ErrorKind.CRASH and outcome.scores == {"c0": 0.0, "c1": 0.0}
    assert "bad \\udcff byte 1" in (outcome.error or ""), outcome.error
    assert outcome.case_errors == {"c0": "ValueError: bad \\udcff byte 1", "c1": "ValueError: bad \\udcff byte 1"}
    assert_storable(outcome)
    answered = sandbox.evaluate(echo_problem, SURROGATE_OUTPUT)  # score()'s own feedback holds the surrogate
    assert answered.error_kind is None and answered.scores == {"c0": 0.0, "c1": 0.0}
    assert answered.feedback == "c0: got \\udcfeok\nc1: got \\udcfeok", answered.feedback
    assert_storable(answered)
    assert_known_vectors(sandbox, echo_problem)


def test_the_archive_stores_any_text_a_reply_or_a_model_holds(tmp_path):
    """The archive's own guarantee, whoever made the text: every text and JSON column binds through a type that
    escapes lone surrogates, the ORM's writes and the Core inserts of a program and of a group alike."""
    from evolve.archive import Archive, CompletionRecord
    from tests.helpers import store_program

    bad = b"\xff".decode("utf-8", "surrogateescape")
    archive = Archive(tmp_path / "a.db")
    try:
        run = archive.create_run("p", f"/p{bad}", "fp", {"note": bad}, 0)
        evaluation = {
            "scores": {"c0": 0.0},
            "scalar": 0.0,
            "duration_s": 0.1,
            "error_kind": "crash",
            "error": f"ValueError: {bad}",
            "feedback": f"got {bad}",
            "stdout": bad,
            "stderr": bad,
            "case_errors": {f"c{bad}": f"raised {bad}"},
        }
        pid, created = store_program(archive, run.id, f"x = 1  # {bad}\n", evaluation=evaluation)
        assert created
        archive.add_group(
            run.id,
            parent_id=pid,
            inspiration_ids=[],
            island=0,
            prompt=f"improve {bad}",
            sampling={"stop": [bad]},
            completions=[CompletionRecord(f"answer {bad}", None, None, "stop", None)],
            variants=[[("parse_error", f"no tag near {bad}", None)]],
        )
        archive.add_incident(run.id, "parse", "ValueError", f"message {bad}")
    finally:
        archive.close()
    db = tmp_path / "a.db"
    assert db_rows(db, "SELECT code FROM programs") == [("x = 1  # \\udcff\n",)]
    assert db_rows(db, "SELECT error, feedback, stdout, stderr, case_errors FROM evaluations") == [
        ("ValueError: \\udcff", "got \\udcff", "\\udcff", "\\udcff", '{"c\\\\udcff": "raised \\\\udcff"}')
    ]
    assert db_rows(db, "SELECT text FROM prompts") == [("improve \\udcff",)]
    assert db_rows(db, "SELECT text, sampling FROM completions") == [("answer \\udcff", '{"stop": ["\\\\udcff"]}')]
    assert db_rows(db, "SELECT detail FROM variants") == [("no tag near \\udcff",)]
    assert db_rows(db, "SELECT message FROM incidents") == [("message \\udcff",)]
    assert db_rows(db, "SELECT problem_dir, config FROM runs") == [("/p\\udcff", '{"note": "\\\\udcff"}')]


class RecordingReplay(ReplayPolicy):
    """The replay policy, one group at a time, keeping every prompt it was sent (what an HTTP policy would send)."""

    max_concurrency = 1

    def __init__(self, texts: list[str]) -> None:
        super().__init__(texts)
        self.prompts: list[str] = []

    def generate(self, prompt, params, n):
        self.prompts.append(prompt)
        return super().generate(prompt, params, n)


def run_children(tmp_path: Path, folder: Path, children: list[str]) -> tuple[str, Path, RecordingReplay]:
    """A run of the process sandbox (jailed) whose policy writes `children`, one per group, in order, once each
    (its budget is that many groups). Returns why it stopped, its archive and the policy."""
    from evolve.archive import Archive
    from evolve.loop import SearchLoop, run_search
    from evolve.options import RunOptions
    from evolve.runs import open_run

    problem = load_problem(folder)
    archive = Archive(tmp_path / "a.db")
    options = RunOptions(
        workers=1,
        group_size=1,
        variants=1,
        max_evaluations=100,
        max_groups=len(children),
        edit_format="full",
        seed=0,
        stop_when_solved=False,
        asks="base",
        structured="off",
        stall_groups=0,
    )
    run = open_run(archive, problem, options).run
    policy = RecordingReplay([f"<variant 1>\n```python\n{code}```\n</variant 1>\n" for code in children])
    sandbox = hiding_sandbox("process", 1)
    try:
        reason = run_search(SearchLoop(problem, archive, policy, sandbox, run, options))
    finally:
        sandbox.close()
        archive.close()
    return reason, tmp_path / "a.db", policy


def stored(db: Path) -> dict[str, tuple[dict, str | None, str | None]]:
    """Every evaluated program of the run, by its editable code (what a child answered, stripped): (scores, error
    kind, error)."""
    rows = db_rows(
        db, "SELECT code, scores, error_kind, error FROM programs JOIN evaluations ON program_id = programs.id"
    )
    return {editable(code): (json.loads(scores), kind, error) for code, scores, kind, error in rows}


def editable(code: str) -> str:
    return code.replace("# EVOLVE-BLOCK-START\n", "").replace("# EVOLVE-BLOCK-END\n", "").strip()


def test_candidates_raising_lone_surrogates_are_stored_and_the_run_goes_on(tmp_path):
    folder = write_problem(tmp_path / "p", evaluate=ECHO_EVAL)
    hostile = [raising(k) for k in range(8)] + [SURROGATE_OUTPUT]  # more than max_failures (5) in a row
    reason, db, policy = run_children(tmp_path, folder, [*hostile, *(code for code, _ in KNOWN[1:])])
    assert reason == "group budget reached", reason
    assert db_rows(db, "SELECT stage, message FROM incidents") == []
    rows = stored(db)
    assert len(rows) == 1 + len(hostile) + 3  # nothing lost: the seed, every hostile child, the honest ones
    for k in range(8):
        scores, kind, error = rows[editable(raising(k))]
        assert (scores, kind) == ({"c0": 0.0, "c1": 0.0}, "crash") and f"bad \\udcff byte {k}" in error, error
    feedback = db_rows(db, "SELECT feedback FROM evaluations WHERE feedback LIKE 'c0: got %ok%'")
    assert feedback == [("c0: got \\udcfeok\nc1: got \\udcfeok",)]
    assert {code: rows[editable(code)][:2] for code, _ in KNOWN[1:]} == {code: (want, None) for code, want in KNOWN[1:]}
    for prompt in policy.prompts:  # what went to the policy is valid UTF-8 (an HTTP body can carry it)
        prompt.encode("utf-8")


SIMPLE_TOML = simple_form_toml(("exact", "close"), timeout_s=5)
# An honest evaluator whose feedback holds undecodable bytes of the program's own output, decoded as Python does.
SIMPLE_EVAL = """
import importlib.util

def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("candidate", program_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    exact = sum(module.solve(x) == x * x for x in range(4))
    close = sum(abs(module.solve(x) - x * x) <= 2 for x in range(4))
    note = b"read \\xff from the program".decode("utf-8", "surrogateescape")
    return {"exact": exact / 4, "close": close / 4}, note
"""
SIMPLE_SEED = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return x\n# EVOLVE-BLOCK-END\n"
SIMPLE_KNOWN = [
    ("def solve(x):\n    return x * x\n", {"exact": 1.0, "close": 1.0}),
    ("def solve(x):\n    return x * x + 1\n", {"exact": 0.0, "close": 1.0}),
    ("def solve(x):\n    return 100\n", {"exact": 0.0, "close": 0.0}),
]


@pytest.mark.slow
def test_an_evaluators_feedback_with_a_lone_surrogate_neither_fails_check_nor_ends_the_run(tmp_path):
    folder = write_problem(tmp_path / "p", seed=SIMPLE_SEED, evaluate=SIMPLE_EVAL, toml=SIMPLE_TOML)
    check = subprocess.run(
        [sys.executable, "-m", "evolve.cli", "check", str(folder), "--allow-weak-sandbox", "--sandbox", "process"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert check.returncode == 0 and "Traceback" not in check.stdout + check.stderr, check.stdout + check.stderr
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([f"<variant 1>\n```python\n{code}```\n</variant 1>\n" for code, _ in SIMPLE_KNOWN]))
    db = tmp_path / "a.db"
    command = evolve_run_cmd(folder, db, f"replay:{replay}", 1 + len(SIMPLE_KNOWN), "--workers", "1")
    command += ["--group-size", "1", "--variants", "1", "--edit-format", "full", "--stall-groups", "0"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300)
    said = out.stdout + out.stderr
    assert out.returncode == 0 and "Traceback" not in said and "evaluation budget reached" in said, said[-3000:]
    assert db_rows(db, "SELECT COUNT(*) FROM incidents") == [(0,)]
    rows = stored(db)
    assert {code: rows[editable(code)][:2] for code, _ in SIMPLE_KNOWN} == {
        code: (want, None) for code, want in SIMPLE_KNOWN
    }
    notes = db_rows(db, "SELECT DISTINCT feedback FROM evaluations")
    assert notes == [("read \\udcff from the program",)], notes


# ---- finding 7: forged replies ---------------------------------------------------------------------------------


def forging(reply: object, k: int = 0) -> str:
    """A candidate that patches json.dumps at import, so the harness sends `reply` (Python source) as its answer."""
    return (
        f"import json\n_real = json.dumps\n_K = {k}\n\n"
        "def _forged(obj, *args, **kwargs):\n"
        "    if 'default' in kwargs:  # the harness's own reply, the last thing it writes\n"
        f"        obj = {reply}\n"
        "    return _real(obj, *args, **kwargs)\n\n"
        "json.dumps = _forged\n\n"
        "def solve(x):\n    return x * x\n"
    )


LIST_KIND = '{"outputs": {n: {"kind": ["crash"], "error": "forged"} for n in ("c0", "c1")}}'
FORGED = {
    "a kind that is a list, every case": LIST_KIND,
    "a kind that is a list, one case": '{"outputs": {"c0": {"ok": 4}, "c1": {"kind": ["crash"], "error": "x"}}}',
    "a kind that is a dict": '{"outputs": {"c0": {"kind": {"a": 1}, "error": "x"}, "c1": {"ok": 9}}}',
    "a top-level kind that is a list": '{"kind": ["crash"], "error": "forged"}',
    "a top-level kind that is NaN": '{"kind": float("nan"), "error": "forged"}',
    "an unknown kind": '{"kind": "sandbox_says_fine", "error": "forged"}',
    "the scorer's own kind": '{"outputs": {n: {"kind": "scorer", "error": "forged"} for n in ("c0", "c1")}}',
    "an error that is a list": '{"kind": "crash", "error": ["forged"]}',
    "a case error that is a huge number": '{"outputs": {"c0": {"kind": "crash", "error": 10 ** 300}, "c1": {"ok": 9}}}',
    "a case error that is infinite": '{"outputs": {"c0": {"kind": "crash", "error": float("inf")}, "c1": {"ok": 9}}}',
    "a case that is not an object": '{"outputs": {"c0": {"ok": 4}, "c1": [9]}}',
    "a case with neither ok nor kind": '{"outputs": {"c0": {"ok": 4}, "c1": {"value": 9}}}',
    "a case with both ok and kind": '{"outputs": {"c0": {"ok": 4, "kind": "crash", "error": "x"}, "c1": {"ok": 9}}}',
    "outputs that are a list": '{"outputs": [4, 9]}',
    "no outputs": '{"result": {"c0": {"ok": 4}}}',
    "a build time that is text": '{"outputs": {"c0": {"ok": 4}, "c1": {"ok": 9}}, "build_s": "0.1"}',
    "a reply that is a list": "[{'ok': 4}, {'ok': 9}]",
}


def on_both_slots(attack: Callable[[str, str], None], replies: dict[str, str]) -> None:
    """Each attack (a forged reply, then the honest programs one after another) as before, two at a time: the
    sandboxes have two slots, and most of an evaluation's time is the jail's setup, not CPU (measured on one core:
    20 process-sandbox evaluations took 6.7 s one at a time, 3.6 s two at a time). Every assertion still runs."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        for done in [pool.submit(attack, name, reply) for name, reply in replies.items()]:
            done.result()


def test_every_malformed_reply_is_bad_output_and_honest_answers_stay_exact(sandbox, echo_problem):
    def attack(name: str, reply: str) -> None:
        outcome = sandbox.evaluate(echo_problem, forging(reply))
        got = (outcome.error_kind, outcome.scores, outcome.error)
        assert outcome.error_kind == ErrorKind.BAD_OUTPUT and outcome.scores == {"c0": 0.0, "c1": 0.0}, (name, got)
        assert_known_vectors(sandbox, echo_problem)

    on_both_slots(attack, FORGED)


SIMPLE_FORGED = {
    "scores that are a list": '{"scores": [1.0, 1.0]}',
    "a score that is text": '{"scores": {"exact": "1.0", "close": 1.0}}',
    "a score that is a list": '{"scores": {"exact": [1.0], "close": 1.0}}',
    "a score that is NaN": '{"scores": {"exact": float("nan"), "close": 1.0}}',
    "feedback that is a list": '{"scores": {"exact": 1.0, "close": 1.0}, "feedback": ["well done"]}',
    "incomplete that is a number": '{"scores": {"exact": 1.0, "close": 1.0}, "incomplete": 7}',
    "stages that are text": '{"scores": {"exact": 1.0, "close": 1.0}, "stages": "all"}',
    "a stage that is a number": '{"scores": {"exact": 1.0, "close": 1.0}, "stages": [1]}',
    "a stage metric too large for a float": (
        '{"scores": {"exact": 1.0, "close": 1.0}, "stages": [{"stage": 1, "metrics": {"exact": 10 ** 400}}]}'
    ),
    "no scores": '{"feedback": "all good"}',
}


def test_every_malformed_simple_form_reply_is_bad_output(sandbox, tmp_path):
    problem = load_problem(write_problem(tmp_path / "simple", seed=SIMPLE_SEED, evaluate=SIMPLE_EVAL, toml=SIMPLE_TOML))

    def attack(name: str, reply: str) -> None:
        outcome = sandbox.evaluate(problem, forging(reply))
        got = (outcome.error_kind, outcome.scores, outcome.error)
        assert outcome.error_kind == ErrorKind.BAD_OUTPUT and outcome.scores == {"exact": 0.0, "close": 0.0}, (
            name,
            got,
        )
        assert_storable(outcome)
        assert [sandbox.evaluate(problem, code).scores for code, _ in SIMPLE_KNOWN] == [w for _, w in SIMPLE_KNOWN]

    on_both_slots(attack, SIMPLE_FORGED)


def test_children_forging_their_reply_are_stored_as_bad_output_and_the_run_goes_on(tmp_path):
    folder = write_problem(tmp_path / "p", evaluate=ECHO_EVAL)
    hostile = [forging(LIST_KIND, k) for k in range(7)]  # more than max_failures (5) in a row
    reason, db, _ = run_children(tmp_path, folder, [*hostile, *(code for code, _ in KNOWN[1:])])
    assert reason == "group budget reached", reason
    assert db_rows(db, "SELECT stage, message FROM incidents") == []
    rows = stored(db)
    assert len(rows) == 1 + len(hostile) + 3
    assert [rows[editable(code)][:2] for code in hostile] == [({"c0": 0.0, "c1": 0.0}, "bad_output")] * len(hostile)
    assert {code: rows[editable(code)][:2] for code, _ in KNOWN[1:]} == {code: (want, None) for code, want in KNOWN[1:]}
