"""Training an ensemble: a trainable member is updated from the groups it sampled itself, in a version lineage of
its own; a member that cannot be trained (a replay) says so once and only samples. Real tiny transformers model,
process sandbox, SQLite archive, the command-line app."""

from __future__ import annotations

import json
import sqlite3

import pytest
from typer.testing import CliRunner

from tests.helpers import write_square_problem

pytestmark = pytest.mark.slow

SQUARES = [
    "<variant 1>\n```python\ndef solve(x):\n    return x * x\n```\n</variant 1>\n"
    f"<variant 2>\n```python\ndef solve(x):\n    return x ** 2 + {k}\n```\n</variant 2>\n"
    for k in range(40)
]


def test_each_trainable_member_learns_from_its_own_groups_and_an_untrainable_one_says_so_once(tmp_path, tiny_model_dir):
    from evolve.cli import app
    from evolve.search import member_folder

    folder = write_square_problem(tmp_path / "sq")
    replay = tmp_path / "squares.json"
    replay.write_text(json.dumps(SQUARES))
    tiny, rep = f"transformers:{tiny_model_dir}", f"replay:{replay}"
    db = tmp_path / "a.db"
    args = ["run", str(folder), "--db", str(db), "--policy", tiny, "--policy", rep, "--sandbox", "process"]
    args += ["--max-evaluations", "16", "--train-every", "2", "--learning-rate", "1e-3", "--allocation", "uniform"]
    args += ["--asks", "base", "--no-stop-when-solved"]
    out = CliRunner().invoke(app, args, catch_exceptions=False)
    assert out.exit_code == 0, out.output
    said = [line for line in out.output.splitlines() if "is not trained" in line]
    assert said == [f"member {rep} is not trained: policy 'replay:squares.json' cannot load new adapters"]
    con = sqlite3.connect(db)
    versions = con.execute("SELECT member, number, adapter_path, stats FROM policy_versions ORDER BY id").fetchall()
    trained = [v for v in versions if v[1] > 0]
    assert trained and {v[0] for v in trained} == {tiny}  # only the trainable member has new versions
    assert [v[1] for v in versions if v[0] == rep] == [0]
    for _member, number, adapter, stats in trained:
        assert adapter == str(member_folder(tmp_path / "a.adapters", [tiny, rep], tiny) / f"v{number}")
        # the replay's groups (no token ids) were never read: the trainer skipped nothing for that reason
        assert "completion without token ids or logprobs" not in json.loads(stats)["skipped"]
    groups = dict(con.execute("SELECT member, COUNT(*) FROM prompts GROUP BY member").fetchall())
    assert groups[tiny] >= 2 and groups[rep] >= 2  # both sampled
