"""Runs left alone: resume is exact: the stored options, the overrides it records, a budget extended."""

from __future__ import annotations

import json
import sqlite3

import pytest

from tests.unattended_runs import evolve, init_with_replay, varied

pytestmark = pytest.mark.slow


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
