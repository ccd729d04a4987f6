"""`evolve train`: offline updates from the groups a run already archived, as the command line runs them.

The commands run in this process through the command-line app (each `python -m evolve.cli` would only import the
engine and torch again); each invocation builds its policy from the archive alone, as a new process would."""

from __future__ import annotations

import sqlite3

import pytest
from typer.testing import CliRunner

from evolve.cli import app

pytestmark = pytest.mark.slow


def _train(db, *args: str):
    command = ["train", str(db), "--learning-rate", "1e-3", *args]
    return CliRunner().invoke(app, command, catch_exceptions=False)


def test_evolve_train_writes_versions_and_continues_from_the_newest(tmp_path, tiny_search):
    db = tiny_search.copy_to(tmp_path / "run.db")  # a search by the tiny model, which the run records as its policy

    bad = _train(db, "--method", "ppo")
    assert bad.exit_code != 0 and "--method ppo: use vpo, grpo or multi-rlvr" in bad.output

    first = _train(db, "--steps", "2")
    assert first.exit_code == 0, first.output[-2000:]
    assert "update 1: policy v1" in first.output and "update 2: policy v2" in first.output
    # A later invocation serves v2 first, then writes v3 on top, with reward shaping of its own
    again = _train(db, "--method", "grpo", "--lazy-penalty", "-0.5", "--reward-normalisation", "group")
    assert again.exit_code == 0 and "update 1: policy v3" in again.output, again.output[-2000:]

    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT v.number, v.adapter_path, p.number, json_extract(v.train_config, '$.method') FROM policy_versions v "
        "LEFT JOIN policy_versions p ON v.parent_id = p.id ORDER BY v.number"
    ).fetchall()
    adapters = tmp_path / "run.adapters"
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert [r[2] for r in rows] == [None, 0, 1, 2]  # each version names the one it was trained from
    assert [r[3] for r in rows[1:]] == ["vpo", "vpo", "grpo"]
    shaping = con.execute(
        "SELECT json_extract(train_config, '$.lazy_penalty'), json_extract(train_config, '$.reward_normalisation'), "
        "json_extract(train_config, '$.skip_zero_advantage') FROM policy_versions WHERE number > 0 ORDER BY number"
    ).fetchall()
    assert shaping == [(0.0, "improvement", 1), (0.0, "improvement", 1), (-0.5, "group", 1)]  # the run's, then flags
    for number, path, _, _ in rows[1:]:
        assert path == str(adapters / f"v{number}")
        assert (adapters / f"v{number}" / "adapter_model.safetensors").is_file()
    assert sorted(p.name for p in adapters.iterdir()) == ["v1", "v2", "v3"]  # nothing half-written left behind


def test_load_batch_marks_every_answer_without_a_new_valid_program_as_wasted(tiny_search):
    """Copies, unparseable or missing answers and programs that failed are marked alike: under the lazy penalty a
    copy alone below a failure made writing nothing parseable the way up (a GRPO policy trained so wrote no
    parseable variant in 180, issue 36)."""
    from evolve.archive import Archive
    from evolve.training import load_batch, recent_version_ids

    archive = Archive(tiny_search.db)
    versions = recent_version_ids(archive, tiny_search.run_id, 10**6)
    batch = load_batch(archive, tiny_search.run_id, tiny_search.components, 2, versions)
    archive.close()
    con = sqlite3.connect(tiny_search.db)
    valid = {
        (c, s)
        for c, s in con.execute(
            "SELECT v.completion_id, v.slot FROM variants v JOIN evaluations e ON e.program_id = v.program_id "
            "WHERE v.status = 'ok' AND e.error_kind IS NULL"
        )
    }
    statuses = dict(((c, s), st) for c, s, st in con.execute("SELECT completion_id, slot, status FROM variants"))
    marked = {(c.completion_id, k): bool(c.wasted[k]) for g in batch.groups for c in g.completions for k in range(2)}
    assert marked == {key: key not in valid for key in marked}
    assert any(marked.values()) and not all(marked.values())
    assert {statuses.get(key) for key, wasted in marked.items() if wasted} >= {"duplicate"}, "copies are marked"
