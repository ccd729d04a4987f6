"""Runs left alone: a variant echoing the EVOLVE block's markers is refused, and a run goes on to its end."""

from __future__ import annotations

import sqlite3

import pytest

from evolve.problem import find_blocks
from evolve.prompts import PromptInputs, ShownProgram, build_prompt
from tests.unattended_runs import STRAY_END, evolve, init_with_replay

pytestmark = pytest.mark.slow


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
