"""`evolve train`: offline updates from the groups a run already archived, as the command line runs them."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from tests.helpers import evolve_run_cmd, write_square_problem

pytestmark = pytest.mark.slow


def _train(db, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "evolve.cli", "train", str(db), "--learning-rate", "1e-3", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


def test_evolve_train_writes_versions_and_continues_from_the_newest(tmp_path, tiny_model_dir):
    folder = write_square_problem(tmp_path / "sq")
    db = tmp_path / "run.db"
    search = subprocess.run(
        evolve_run_cmd(folder, db, f"transformers:{tiny_model_dir}", 8), capture_output=True, text=True, timeout=600
    )
    assert search.returncode == 0, search.stderr[-2000:]

    bad = _train(db, "--method", "ppo")
    assert bad.returncode != 0 and "--method ppo: use vpo, grpo or multi-rlvr" in bad.stdout + bad.stderr

    first = _train(db, "--steps", "2")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    assert "update 1: policy v1" in first.stdout and "update 2: policy v2" in first.stdout
    again = _train(db, "--method", "grpo")  # a later invocation serves v2 first, then writes v3 on top
    assert again.returncode == 0 and "update 1: policy v3" in again.stdout, again.stdout + again.stderr[-2000:]

    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT v.number, v.adapter_path, p.number, json_extract(v.train_config, '$.method') FROM policy_versions v "
        "LEFT JOIN policy_versions p ON v.parent_id = p.id ORDER BY v.number"
    ).fetchall()
    adapters = tmp_path / "run.adapters"
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert [r[2] for r in rows] == [None, 0, 1, 2]  # each version names the one it was trained from
    assert [r[3] for r in rows[1:]] == ["vpo", "vpo", "grpo"]
    for number, path, _, _ in rows[1:]:
        assert path == str(adapters / f"v{number}")
        assert (adapters / f"v{number}" / "adapter_model.safetensors").is_file()
    assert sorted(p.name for p in adapters.iterdir()) == ["v1", "v2", "v3"]  # nothing half-written left behind
