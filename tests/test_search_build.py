"""`build_search` owns what it opens: a failure part-way closes the archive and the sandbox it had opened, and
`Search.close` closes the policy, the sandbox and the archive. Shown with real resources: the process sandbox's
slot locks and the SQLite archive's open files, read from /proc/self/fd."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from evolve.options import RunOptions, RunOverrides
from evolve.problem import load_problem
from evolve.search import SearchSetupError, build_search
from sandboxes.process_slots import LOCK_DIR
from tests.helpers import write_square_problem


def open_files_under(*roots: Path) -> list[str]:
    """The files this process holds open whose path starts with one of `roots`."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor)
            continue
        if any(target.startswith(str(root)) for root in roots):
            held.append(target)
    return held


def test_a_failing_policy_spec_closes_the_archive_and_the_sandbox_already_open(tmp_path):
    problem = load_problem(write_square_problem(tmp_path / "sq"))
    db = tmp_path / "a.db"
    missing = tmp_path / "missing.json"
    before = open_files_under(LOCK_DIR)
    with pytest.raises(SearchSetupError, match="no such replay file"):
        build_search(problem, RunOverrides(policy=f"replay:{missing}", sandbox="process", workers=2), db=db)
    assert db.exists()  # the archive was opened before the policy failed
    assert open_files_under(db) == [] and open_files_under(LOCK_DIR) == before


def test_closing_a_search_closes_its_policy_sandbox_and_archive(tmp_path):
    problem = load_problem(write_square_problem(tmp_path / "sq"))
    db, replay = tmp_path / "a.db", tmp_path / "replay.json"
    replay.write_text(json.dumps(["no answer"]))
    before = open_files_under(LOCK_DIR)
    search = build_search(problem, RunOverrides(policy=f"replay:{replay}", sandbox="process", workers=2), db=db)
    assert open_files_under(db) and len(open_files_under(LOCK_DIR)) == len(before) + 2  # two slots held
    search.close()
    assert open_files_under(db) == [] and open_files_under(LOCK_DIR) == before
    search.close()  # a second close is harmless


def test_overrides_name_every_option_and_a_whole_options_object_overrides_all_of_them():
    assert [f.name for f in fields(RunOverrides)] == [f.name for f in fields(RunOptions)]
    options = RunOptions(workers=3, policy="replay:x.json", target=0.5)
    given = RunOverrides.of(options).given()
    assert given == {k: v for k, v in asdict(options).items() if v is not None}
    assert RunOverrides().given() == {}


def test_run_help_states_the_defaults_and_methods_from_their_one_home():
    """The help of `evolve run` shows each default it names, read from `RunOptions`, and the training methods the
    trainer has (rich once dropped every `[default: ...]` of these options as markup)."""
    from typer.testing import CliRunner

    from evolve.cli import app
    from policies.advantages import METHODS

    shown = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "300"}, terminal_width=300)
    assert shown.exit_code == 0
    defaults = RunOptions()
    for value in (defaults.workers, defaults.seed, defaults.stall_groups, defaults.max_failures, defaults.policy):
        assert f"[default: {value}]" in shown.output
    assert f"{' | '.join(METHODS)}: " in shown.output and f"[default: {defaults.train_method}]" in shown.output


def test_help_written_to_a_pipe_shows_every_option_whole():
    """`evolve run --help | less` or `> help.txt`: rich lays help out at 80 columns when stdout is not a terminal,
    which cut option names short with "…" (`--fit-tokens-to-co…`); the console script widens it there."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH", "FORCE_COLOR")}
    script = "from evolve.cli import main; main()"
    shown = subprocess.run(
        [sys.executable, "-c", script, "run", "--help"], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert "…" not in shown
    for option in ("--fit-tokens-to-code", "--reward-normalisation", "--max-evaluations", "--stall-groups"):
        assert option in shown


def test_max_groups_stops_a_run_at_its_group_budget_and_a_resume_extends_it(tmp_path):
    """`--max-groups N`: a budget in samples, not minutes (a slow machine's group takes minutes, and `--max-time`
    cuts the one being sampled); counted over resumes, as `--max-evaluations` is."""
    import sqlite3
    import subprocess
    import sys

    from tests.helpers import evolve_run_cmd
    from tests.report_run import replay_answers

    folder = write_square_problem(tmp_path / "square")
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps(replay_answers()))
    db = tmp_path / "runs.db"

    def groups() -> int:
        with sqlite3.connect(db) as con:
            return con.execute("SELECT COUNT(*) FROM prompts").fetchone()[0]

    cmd = evolve_run_cmd(folder, db, f"replay:{replay}", 100, "--workers", "1", "--group-size", "2")
    first = subprocess.run([*cmd, "--max-groups", "2"], capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "group budget reached" in first.stdout and groups() == 2
    resume = [sys.executable, "-m", "evolve.cli", "resume", str(db), "--max-groups", "3"]
    second = subprocess.run(resume, capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    assert groups() == 3


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file immutable (chattr +i) needs root")
def test_an_archive_that_cannot_be_written_is_one_line_not_a_traceback(tmp_path):
    """A run resumed on an archive it can read but not write (immutable here; a read-only mount, a full disk)
    fails at its first write with one line that says so, exit 2, instead of SQLAlchemy's 90-line traceback."""
    import subprocess
    import sys

    from tests.helpers import evolve_run_cmd
    from tests.report_run import replay_answers

    folder = write_square_problem(tmp_path / "square")
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps(replay_answers()))
    db = tmp_path / "runs.db"
    made = subprocess.run(
        evolve_run_cmd(folder, db, f"replay:{replay}", 4), capture_output=True, text=True, timeout=300
    )
    assert made.returncode == 0, made.stderr[-2000:]
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem has no immutable attribute")
    try:
        resume = [sys.executable, "-m", "evolve.cli", "resume", str(db), "--max-evaluations", "8"]
        out = subprocess.run(resume, capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip() == (
        f"error: {db}: cannot write the archive (attempt to write a readonly database); check the file's and its "
        "folder's permissions and free space"
    )
