"""`build_search` owns what it opens: a failure part-way closes the archive and the sandbox it had opened, and
`Search.close` closes the policy, the sandbox and the archive. Shown with real resources: the process sandbox's
slot locks and the SQLite archive's open files, read from /proc/self/fd."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from evolve.problem import load_problem
from evolve.runs import RunOptions, RunOverrides
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
