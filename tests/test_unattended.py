"""Runs left alone: a stray marker, a broken part or a kill never ends a run for good, and resume is exact.

Real parts throughout: `evolve` in a subprocess, a real SQLite archive, the process sandbox, a replay policy.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.archive import Archive
from evolve.problem import find_blocks, load_problem
from evolve.prompts import PromptInputs, ShownProgram, build_prompt
from sandboxes.process import ProcessSandbox
from tests.helpers import SPLIT_EVAL, SPLIT_TOML, executions, log_executions, write_problem

pytestmark = pytest.mark.slow

EVOLVE = [sys.executable, "-m", "evolve.cli"]

STRAY_END = (
    "<variant 1>\n```python\ndef solve(x):\n    return x * 2\n# EVOLVE-BLOCK-END\n```\n</variant 1>\n"
    "<variant 2>\n```python\ndef solve(x):\n    return x + 3\n```\n</variant 2>\n"
    "<variant 3>\n<<<<<<< SEARCH\n    return x\n=======\n    return x - 1\n# EVOLVE-BLOCK-START\n"
    ">>>>>>> REPLACE\n</variant 3>"
)


def varied(n: int) -> list[str]:
    """n completions, each with one new valid child, and the stray markers between them."""
    return [STRAY_END] + [
        f"<variant 1>\n```python\ndef solve(x):\n    return x * {k} + 1\n```\n</variant 1>" for k in range(n)
    ]


def evolve(*args: str, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLVE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def initialised(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder made by `evolve init` in a subprocess, as a user makes one, once for the module: the tests copy
    it (`evolve init` writes the same folder every time; another subprocess would only import the engine again)."""
    folder = tmp_path_factory.mktemp("init") / "demo"
    made = evolve("init", str(folder))
    assert made.returncode == 0, made.stderr[-2000:]
    return folder


def init_with_replay(tmp_path: Path, initialised: Path, texts: list[str]) -> tuple[Path, Path]:
    folder = tmp_path / "demo"
    shutil.copytree(initialised, folder)
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps(texts))
    return folder, replay


def test_stray_end_marker_is_rejected_and_the_run_finishes(tmp_path, initialised):
    """The crash of issue 9: a variant echoing `# EVOLVE-BLOCK-END` became a parent and killed every run."""
    folder, replay = init_with_replay(tmp_path, initialised, [STRAY_END])
    db = tmp_path / "d.db"
    args = ["run", str(folder), "--db", str(db), "--policy", f"replay:{replay}", "--sandbox", "process"]
    out = evolve(*args, "--max-evaluations", "3")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Traceback" not in out.stdout + out.stderr
    con = sqlite3.connect(db)
    statuses = dict(con.execute("SELECT status, COUNT(*) FROM variants GROUP BY status").fetchall())
    assert statuses["bad_blocks"] >= 2  # the added END and the added START, every time they were sampled
    assert con.execute("SELECT status FROM runs").fetchone()[0] == "finished"
    # no archived program has a broken frame, and each one rebuilds a prompt
    for (code,) in con.execute("SELECT code FROM programs"):
        assert len(find_blocks(code)) == 1 and code.count("EVOLVE-BLOCK-END") == 1
        build_prompt(PromptInputs("d", code, {}, None, [ShownProgram(code, {})], 3, "diff"))
    again = evolve(*args)  # the bare command on a finished run resumes it and ends cleanly, no traceback
    assert again.returncode == 0 and "Traceback" not in again.stdout + again.stderr, again.stderr[-2000:]


def test_a_program_with_broken_markers_still_gets_a_prompt():
    """Archives written before `bad_blocks` existed may hold such a program: it is shown whole, not raised on."""
    broken = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return x\n# EVOLVE-BLOCK-END\n# EVOLVE-BLOCK-END\n"
    text = build_prompt(PromptInputs("d", broken, {"a": 1.0}, None, [ShownProgram(broken, {"a": 0.0})], 2, "full"))
    assert text.count("return x") == 2


def test_resume_keeps_stored_options_records_overrides_and_extends_budget(tmp_path, initialised):
    folder, replay = init_with_replay(tmp_path, initialised, varied(12))
    db = tmp_path / "d.db"
    first = evolve(
        "run", str(folder), "--db", str(db), "--policy", f"replay:{replay}", "--sandbox", "process",
        "--max-evaluations", "3", "--workers", "1", "--seed", "7", "--group-size", "2",
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-2000:]
    stored = json.loads(sqlite3.connect(db).execute("SELECT config FROM runs").fetchone()[0])["options"]
    assert (stored["policy"], stored["sandbox"], stored["workers"], stored["seed"]) == (
        f"replay:{replay}", "process", 1, 7,
    )  # fmt: skip
    assert (stored["group_size"], stored["max_evaluations"]) == (2, 3)
    bare = evolve("run", str(folder), "--db", str(db))  # no flags: the embedded model would be the default
    assert bare.returncode == 0 and "resuming run 1" in bare.stdout, bare.stderr[-2000:]
    config = json.loads(sqlite3.connect(db).execute("SELECT config FROM runs").fetchone()[0])
    assert config["options"] == stored and config.get("overrides", []) == []
    extended = evolve("resume", str(db), "--max-evaluations", "4")
    assert extended.returncode == 0, extended.stderr[-2000:]
    assert "option max_evaluations: 3 -> 4" in extended.stdout
    config = json.loads(sqlite3.connect(db).execute("SELECT config FROM runs").fetchone()[0])
    assert config["options"] == {**stored, "max_evaluations": 4}
    assert config["overrides"][-1]["changes"] == {"max_evaluations": [3, 4]}
    evaluations = sqlite3.connect(db).execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
    assert evaluations == 4
    shown = evolve("inspect", str(db))
    assert "with max_evaluations 3 -> 4" in shown.stdout, shown.stdout
    missing = evolve("resume", str(db), "--run", "9")
    assert missing.returncode == 2 and "no run 9" in missing.stderr


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


def unique_children(n: int) -> list[str]:
    """n completions of three new, valid children each."""
    return [
        "".join(
            f"<variant {i}>\n```python\ndef solve(x):\n    return x * {3 * k + i} - {k}\n```\n</variant {i}>\n"
            for i in (1, 2, 3)
        )
        for k in range(n)
    ]


def run_replay(
    tmp_path: Path, initialised: Path, texts: list[str], *extra: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    folder, replay = init_with_replay(tmp_path, initialised, texts)
    db = tmp_path / "d.db"
    out = evolve(
        "run", str(folder), "--db", str(db), "--policy", f"replay:{replay}", "--sandbox", "process",
        "--workers", "1", *extra,
    )  # fmt: skip
    return out, db


def pending_children(db: Path) -> int:
    con = sqlite3.connect(db)
    return con.execute("SELECT COUNT(*) FROM variants WHERE status = 'ok' AND program_id IS NULL").fetchone()[0]


def test_stall_is_judged_on_evaluated_children_and_strands_nothing(tmp_path, initialised):
    """A fast policy repeating 6 completions (18 children) to one worker: every child is evaluated before the
    run calls itself stalled (issue 9 saw 20 of 24 left pending)."""
    out, db = run_replay(tmp_path, initialised, unique_children(6), "--max-evaluations", "200")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "stalled" in out.stdout
    assert pending_children(db) == 0
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == 1 + 18


def test_patience_stops_and_drains_the_queue(tmp_path, initialised):
    out, db = run_replay(tmp_path, initialised, unique_children(30), "--max-evaluations", "200", "--patience", "4")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "patience: no new best scalar in 4 evaluations" in out.stdout
    assert pending_children(db) == 0
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] < 1 + 90


def test_a_solved_problem_stops_by_itself(tmp_path, initialised):
    """Bounds [0, 1] on every case: a child scoring 1.0 everywhere solves it; the queue is still drained."""
    hidden = (initialised / "evaluate.py").read_text()
    exact = "<variant 1>\n```python\ndef solve(x):\n    return x\n```\n</variant 1>"
    texts = [*unique_children(3), exact.replace("return x", f"return {_hidden_expr(hidden)}")]
    out, db = run_replay(tmp_path, initialised, texts, "--max-evaluations", "200")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "solved: every component reached its best declared bound" in out.stdout, out.stdout
    assert pending_children(db) == 0


def test_copies_of_a_child_still_being_stored_do_not_count_towards_a_stall(tmp_path):
    """Seen in CI: the group that found the solving child was slow to store it, the other generators' groups (all
    copies of it, so duplicates) counted as barren meanwhile, and the run ended `stalled` while that child, once
    evaluated, solved the problem. A child claimed by a group not yet queued is pending work."""
    import time

    from evolve.loop import SearchLoop, run_search
    from policies.replay import ReplayPolicy
    from tests.helpers import square_run

    problem, archive, run, options = square_run(
        tmp_path, max_evaluations=50, stall_groups=3, workers=1, stop_when_solved=True
    )
    store, calls = archive.add_group, []

    def slow_first_store(*args, **kwargs):  # a disk busy for one second, once
        calls.append(1)
        if len(calls) == 1:
            time.sleep(1.0)
        return store(*args, **kwargs)

    archive.add_group = slow_first_store
    policy = ReplayPolicy(["<variant 1>\n```python\ndef solve(x):\n    return x * x\n```\n</variant 1>"])
    sandbox = ProcessSandbox(slots=1)
    try:
        reason = run_search(SearchLoop(problem, archive, policy, sandbox, run, options))
    finally:
        sandbox.close()
    assert reason == "solved: every component reached its best declared bound"
    assert 1 < len(calls) < 20  # groups were stored meanwhile, and they waited for that child rather than spun
    assert pending_children(tmp_path / "a.db") == 0


def _hidden_expr(evaluator: str) -> str:
    import re

    found = re.search(r'"expected": (.+?)}', evaluator)  # the hidden f(x) of `evolve init`
    assert found, evaluator
    return found.group(1).strip()


def test_one_failure_costs_one_group_and_a_repeated_one_stops_the_run_with_one_line(tmp_path):
    """A policy whose server answers twice, then fails once, answers again, then goes away for good."""
    from evolve.fitness import signs
    from evolve.loop import SearchLoop, run_search
    from policies.replay import ReplayPolicy
    from tests.helpers import square_run

    class FlakyServer(ReplayPolicy):
        max_concurrency = 1
        calls = 0

        def generate(self, prompt, params, n):
            self.calls += 1
            if self.calls == 3 or self.calls > 4:
                raise ConnectionError("connection refused by 127.0.0.1:8000")
            return super().generate(prompt, params, n)

    problem, archive, run, options = square_run(tmp_path, max_evaluations=50, max_failures=3, workers=1)
    policy = FlakyServer(unique_children(3))
    sandbox = ProcessSandbox(slots=1)
    try:
        reason = run_search(SearchLoop(problem, archive, policy, sandbox, run, options))
    finally:
        sandbox.close()
    assert reason.startswith("stopped: 3 sample failures in a row (ConnectionError: connection refused")
    assert "evolve resume DB" in reason
    summary = archive.summarize(archive.runs()[0], signs(problem.components))
    assert summary.status == "stopped" and summary.stop_reason == reason.removeprefix("stopped: ")
    assert summary.incidents == {"sample: ConnectionError": 4}  # the lone one, then three in a row
    assert summary.groups == 3 and pending_children(tmp_path / "a.db") == 0
    shown = evolve("inspect", str(tmp_path / "a.db"))
    assert "incidents (cost one group or child each): {'sample: ConnectionError': 4}" in shown.stdout


def test_a_group_ended_as_interrupted_without_a_cut_is_an_incident_not_the_end_of_the_run(tmp_path):
    """A policy that ends a call as interrupted when nothing cut it (an interrupt request left over from an
    earlier search on the same policy object) costs that group; the run goes on to its own budget."""
    from evolve.fitness import signs
    from evolve.loop import SearchLoop, run_search
    from policies.policy import Generated
    from policies.replay import ReplayPolicy
    from tests.helpers import square_run

    class StaleInterrupt(ReplayPolicy):
        max_concurrency = 1
        calls = 0

        def generate(self, prompt, params, n):
            self.calls += 1
            if self.calls == 1:
                return [Generated("", [], [], "interrupted", self.version) for _ in range(n)]
            return super().generate(prompt, params, n)

    problem, archive, run, options = square_run(tmp_path, max_evaluations=7, workers=1)
    sandbox = ProcessSandbox(slots=1)
    try:
        reason = run_search(SearchLoop(problem, archive, StaleInterrupt(unique_children(6)), sandbox, run, options))
    finally:
        sandbox.close()
    assert reason.startswith("evaluation budget"), reason
    summary = archive.summarize(archive.runs()[0], signs(problem.components))
    assert summary.incidents == {"sample: PolicyError": 1}
    assert summary.evaluations == 7 and summary.groups == 1  # the interrupted call stored nothing


def test_sigterm_stops_cleanly_and_a_killed_run_is_recognised(tmp_path, initialised):
    """SIGTERM leaves the run `stopped` (never `running`); a run found `running` is resumed as interrupted.

    The evaluator logs every real execution: at the stop, every scored row had one, and at most the one
    evaluation in flight (one worker) ran without a row; the resumed session executes each child once (one row
    each; a job that failed whole never reaches score(), so only rows without an error are counted)."""
    import os
    import signal
    import time

    folder, replay = init_with_replay(tmp_path, initialised, unique_children(40))
    log = log_executions(folder, tmp_path / "executions.log")
    db = tmp_path / "d.db"
    cmd = [*EVOLVE, "run", str(folder), "--db", str(db), "--policy", f"replay:{replay}", "--sandbox", "process"]
    proc = subprocess.Popen([*cmd, "--max-evaluations", "100", "--workers", "1"], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            if sqlite3.connect(db).execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] >= 3:
                break
        except sqlite3.Error:
            continue
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert "interrupted" in out and "Traceback" not in out
    assert sqlite3.connect(db).execute("SELECT status FROM runs").fetchone()[0] == "stopped"
    scored = "SELECT COUNT(*) FROM evaluations WHERE error_kind IS NULL"
    stopped_with = sqlite3.connect(db).execute(scored).fetchone()[0]
    executed = len(executions(log))
    assert stopped_with <= executed <= stopped_with + 1
    con = sqlite3.connect(db)
    con.execute("UPDATE runs SET status = 'running', updated_at = '2000-01-01 00:00:00'")  # as a SIGKILL leaves it
    con.commit()
    shown = json.loads(evolve("inspect", str(db), "--json").stdout)[0]
    assert shown["status"] == "interrupted"
    # a larger budget: the resumed replay starts again at its first text, so it re-sends children already
    # evaluated (duplicates, never executed again) before it reaches new ones
    again = evolve(*cmd[3:], "--max-evaluations", "30")
    assert "was interrupted (its process was killed)" in again.stdout, again.stdout + again.stderr
    shown = json.loads(evolve("inspect", str(db), "--json").stdout)[0]
    assert shown["status"] == "finished" and shown["interruptions"] == 1 and shown["evaluations"] == 30
    now = sqlite3.connect(db).execute(scored).fetchone()[0]
    assert len(executions(log)) - executed == now - stopped_with, (executed, stopped_with, executions(log))


def test_a_jail_that_cannot_be_made_stops_the_run_with_one_line_instead_of_scoring_each_child_a_crash(
    tmp_path, monkeypatch
):
    """bubblewrap refusing every jail (here a hidden host file is listed but gone, every time) scored each child
    as its own crash, for as long as the run went on. A refused jail is made once more, then is the sandbox's
    failure, not the candidate's: three in a row stop the run with one line, and the same command resumes."""
    import sandboxes.jail
    from evolve.fitness import signs
    from evolve.loop import SearchLoop, run_search
    from policies.replay import ReplayPolicy
    from tests.helpers import hiding_sandbox, square_run

    gone = "/usr/local/lib/evolve-vanished.conf"
    listings = []

    def listed() -> list[str]:
        listings.append(gone)
        return [gone] if len(listings) > 1 else []  # the seed's jail is made; none after it

    problem, archive, run, options = square_run(tmp_path, max_evaluations=50, max_failures=3, workers=1)
    sandbox = hiding_sandbox("process", 1)
    monkeypatch.setattr(sandboxes.jail, "hidden_host_files", listed)  # after the jail's probe, which lists too
    try:
        reason = run_search(SearchLoop(problem, archive, ReplayPolicy(unique_children(4)), sandbox, run, options))
    finally:
        sandbox.close()
    refused = f"the jail could not be made, twice (bwrap: Can't create file at {gone}: Read-only file system)"
    assert reason.startswith("stopped: 3 evaluate failures in a row (SandboxRefused: process sandbox: "), reason
    assert refused in reason and "evolve resume DB" in reason, reason
    assert len(listings) == 1 + 2 * 3  # the seed's, then each child's jail twice
    summary = archive.summarize(archive.runs()[0], signs(problem.components))
    assert summary.incidents == {"evaluate: SandboxRefused": 3} and summary.status == "stopped"


def test_a_jail_refused_at_the_seed_ends_evolve_run_with_one_line(tmp_path, monkeypatch):
    """The seed's evaluation is the run's: its sandbox refusing ended `evolve run` in a traceback."""
    from typer.testing import CliRunner

    import sandboxes.jail
    from evolve.cli import app
    from tests.helpers import write_square_problem

    real, listings = sandboxes.jail.hidden_host_files, []
    gone = "/usr/local/lib/evolve-vanished.conf"

    def listed() -> list[str]:
        listings.append(gone)
        return real() if len(listings) == 1 else [gone]  # the jail's probe passes; every job's jail is refused

    monkeypatch.setattr(sandboxes.jail, "hidden_host_files", listed)
    replay = tmp_path / "answers.json"
    replay.write_text(json.dumps(unique_children(1)))
    folder = write_square_problem(tmp_path / "sq")
    argv = ["run", str(folder), "--db", str(tmp_path / "a.db"), "--policy", f"replay:{replay}", "--sandbox", "process"]
    shown = CliRunner().invoke(app, [*argv, "--max-evaluations", "4"], env={"COLUMNS": "400"}, terminal_width=400)
    assert shown.exit_code == 2, shown.output
    said = f"the jail could not be made, twice (bwrap: Can't create file at {gone}: Read-only file system)"
    assert f"error: the run stopped: process sandbox: {said}" in shown.output, shown.output
    assert "Traceback" not in shown.output and len(listings) == 3
