"""A split-form `score()` or `cases()` that never returns (red-team finding 5 of issue #57).

Such a call hung the engine's evaluation thread, and with it the run and Ctrl-C (the first two did nothing); the
resume hung on the same child. Now `cases()` and `score()` run in processes of their own (evolve/problem/
trusted.py): `cases()` has a deadline at load, each `score()` call the problem's `[limits] timeout_s`, past which
that case is the evaluator's failure (kind `scorer`), and the first Ctrl-C stops the run at once.
After the hang, honest programs are scored in the same sandbox or run and their exact vectors asserted.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from evolve.problem import ProblemError, load_problem
from tests.helpers import KNOWN, assert_known_vectors, db_rows, evolve_run_cmd, hiding_sandbox, write_problem
from tests.test_reply_attacks import TWO_CASES, editable, stored

HANGING_EVAL = (
    TWO_CASES
    + """
import os, time

FLAG = "FLAG_PATH"

def score(case, output):
    if output == 999 and os.path.exists(FLAG):
        with open(FLAG + ".seen", "a") as seen:
            seen.write(case["name"] + "\\n")
        while True:
            time.sleep(0.05)
    return (1.0 if output == case["expected"] else 0.0), repr(output)
"""
)
HANGS = "def solve(x):\n    return 999 if x == 2 else x * x\n"  # c0's output makes score() hang; c1's is right


def hanging_problem(root: Path, timeout: float) -> tuple[Path, Path]:
    """A problem whose score() hangs on the output 999 while `flag` exists; (its folder, the flag)."""
    flag = root / "hang"
    folder = write_problem(root / "p", evaluate=HANGING_EVAL.replace("FLAG_PATH", str(flag)), timeout=timeout)
    flag.write_text("")
    return folder, flag


def test_a_score_past_its_deadline_is_the_evaluators_failure_for_that_case(tmp_path):
    folder, _ = hanging_problem(tmp_path, timeout=2.0)
    problem = load_problem(folder)
    box = hiding_sandbox("process", 1)
    try:
        started, done = time.monotonic(), []
        worker = threading.Thread(target=lambda: done.append(box.evaluate(problem, HANGS)), daemon=True)
        worker.start()
        worker.join(timeout=2.0 + 5.0)
        took = time.monotonic() - started
        assert done, f"evaluate() still waits on score() after {took:.0f} s"
        outcome = done[0]
        assert outcome.scores == {"c0": 0.0, "c1": 1.0}, (outcome.scores, outcome.error)
        assert outcome.error_kind == "scorer", (outcome.error_kind, outcome.error)
        assert outcome.error == "score() ran past its deadline of 2 s ([limits] timeout_s) on case c0", outcome.error
        assert_known_vectors(box, problem)  # the scorer was started again, and scores as before
    finally:
        box.close()


def test_cases_that_never_return_are_one_line_at_load(tmp_path, monkeypatch):
    import evolve.problem.trusted as trusted

    monkeypatch.setattr(trusted, "CASES_TIMEOUT_S", 1.0)
    hang = "import time\n\ndef cases():\n    while True:\n        time.sleep(0.05)\n\n"
    hang += "def score(case, output):\n    return 1.0\n"
    started = time.monotonic()
    with pytest.raises(ProblemError) as err:
        load_problem(write_problem(tmp_path / "p", evaluate=hang))
    assert time.monotonic() - started < 5.0
    message = str(err.value)
    assert "\n" not in message and "cases() did not return within 1 s" in message, message


EXIT_WITHIN_S = 2.0  # from SIGINT to the process's exit, as for a candidate that hangs (test_interrupt_during_...)


@pytest.mark.slow
def test_ctrl_c_stops_a_run_whose_score_hangs_and_the_resume_scores_the_child(tmp_path):
    folder, flag = hanging_problem(tmp_path, timeout=3.0)
    children = [HANGS, KNOWN[1][0]]
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([f"<variant 1>\n```python\n{code}```\n</variant 1>\n" for code in children]))
    db = tmp_path / "a.db"
    command = evolve_run_cmd(folder, db, f"replay:{replay}", 3, "--workers", "1", "--group-size", "1")
    command += ["--variants", "1", "--edit-format", "full", "--stall-groups", "0"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = Path(str(flag) + ".seen")
    try:
        deadline = time.monotonic() + 180
        while not seen.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen.exists(), f"score() never hung: {proc.poll()}"
        time.sleep(0.3)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=20)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stdout.read() if proc.stdout else ""
    assert took < EXIT_WITHIN_S, f"took {took:.1f}s to stop: {out[-1500:]}"
    assert proc.returncode == 0 and "interrupted" in out and "Traceback" not in out, out[-3000:]
    assert db_rows(db, "SELECT status FROM runs") == [("stopped",)]
    # Nothing stored of the child being scored: no evaluation, no failure, no incident; it stays pending. (The other
    # child may have been scored first: the replay's groups are sampled four at a time.)
    assert editable(HANGS) not in stored(db)
    assert db_rows(db, "SELECT COUNT(*) FROM evaluations WHERE error_kind IS NOT NULL") == [(0,)]
    assert db_rows(db, "SELECT COUNT(*) FROM incidents") == [(0,)]
    assert db_rows(db, "SELECT COUNT(*) FROM variants WHERE status = 'ok' AND program_id IS NULL") >= [(1,)]

    # The resume meets the same hang: past its deadline the case is the evaluator's failure, and the run ends.
    again = subprocess.run(
        [sys.executable, "-m", "evolve.cli", "resume", str(db)], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0 and "evaluation budget reached" in again.stdout, again.stdout[-2000:] + again.stderr
    rows = stored(db)
    assert rows[editable(HANGS)][:2] == ({"c0": 0.0, "c1": 1.0}, "scorer"), rows
    assert rows[editable(KNOWN[1][0])][:2] == (KNOWN[1][1], None)
    assert db_rows(db, "SELECT status FROM runs") == [("finished",)]
