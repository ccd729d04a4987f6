"""Where the user keeps things is theirs to choose: folders with spaces, relative paths, commands given from
another working directory. A run must read the same files whichever folder a later command starts in."""

from __future__ import annotations

import json
import shlex
import sqlite3

from typer.testing import CliRunner

from evolve.cli import app
from policies.factory import anchored_spec
from tests.helpers import write_problem

FULL = "<variant 1>\n```python\ndef solve(x):\n    return {a}\n```\n</variant 1>\n"


def test_specs_naming_a_local_file_are_anchored_and_others_are_kept(tmp_path):
    (tmp_path / "model dir").mkdir()
    assert anchored_spec("replay:runs/r.json", tmp_path) == f"replay:{tmp_path}/runs/r.json"
    assert anchored_spec("llama:../m.gguf", tmp_path / "x") == f"llama:{tmp_path}/m.gguf"
    assert anchored_spec("transformers:model dir", tmp_path) == f"transformers:{tmp_path}/model dir"
    for kept in ("embedded", "llama:embedded", "transformers:Qwen/Qwen2.5-Coder-0.5B-Instruct", "replay:/abs.json",
                 "vllm:http://gpu:8000@m", "openai:http://h/v1@m", "vllm-local:Qwen/Q"):  # fmt: skip
        assert anchored_spec(kept, tmp_path) == kept


def test_a_run_given_relative_paths_under_a_spaced_folder_resumes_from_another_folder(tmp_path, monkeypatch):
    home = tmp_path / "odd place"
    write_problem(home / "my problem", name="spaced")
    (home / "replay x.json").write_text(json.dumps([FULL.format(a=e) for e in ("x * x + 0", "x ** 2", "x + x")]))
    runner = CliRunner()

    def invoke(*args: str) -> str:
        result = runner.invoke(app, list(args), catch_exceptions=False)
        assert result.exit_code == 0, (args, result.output)
        return result.output

    monkeypatch.chdir(home)
    out = invoke(
        "run", "my problem", "--db", "runs x/a.db", "--policy", "replay:replay x.json", "--sandbox", "process",
        "--workers", "1", "--group-size", "2", "--variants", "1", "--edit-format", "full", "--max-evaluations", "2",
        "--no-stop-when-solved",
    )  # fmt: skip
    assert "evaluation budget reached" in out, out
    hint = next(line for line in out.splitlines() if line.startswith("see it with:"))
    # the printed command can be pasted into a shell as it is
    assert shlex.split(hint)[3:6] == ["evolve", "best", "runs x/a.db"], hint

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    db = home / "runs x" / "a.db"
    out = invoke("resume", str(db), "--max-evaluations", "4")
    assert "evaluation budget reached" in out, out
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == 4
    assert not (elsewhere / "runs").exists()
