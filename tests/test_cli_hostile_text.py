"""What a candidate writes reaches the operator's terminal only as text: no escape sequences, no rich markup."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from evolve.cli import app
from tests.helpers import write_problem

# Clear the screen, retitle the window, then a fake result in red; and a closing tag that matches nothing.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x1b[31mscalar view 1 ok[/red] [/]"
CANDIDATE = f"# EVOLVE-BLOCK-START\ndef solve(x):\n    raise RuntimeError({HOSTILE!r})\n# EVOLVE-BLOCK-END\n"


def test_evolve_eval_prints_a_hostile_error_as_inert_text(tmp_path: Path) -> None:
    folder = write_problem(tmp_path / "p")
    candidate = tmp_path / "c.py"
    candidate.write_text(CANDIDATE)
    shown = CliRunner().invoke(app, ["eval", str(folder), str(candidate), "--sandbox", "process"])
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.output and "\x07" not in shown.output
    assert "\\x1b[31mscalar view 1 ok[/red] [/]" in shown.output  # the text itself, markup and all, made inert


def test_evolve_show_prints_a_stored_hostile_evaluation_as_inert_text(tmp_path: Path) -> None:
    from evolve.archive import Archive
    from tests.helpers import store_program

    folder = write_problem(tmp_path / "p")
    archive = Archive(tmp_path / "a.db")
    run = archive.create_run("p", str(folder), "fp", {}, 0)
    evaluation = {"scores": {"c0": 0.0}, "scalar": 0.0, "duration_s": 0.1, "error_kind": "crash", "error": HOSTILE}
    evaluation |= {"feedback": HOSTILE, "stderr": HOSTILE, "case_errors": {"c0": HOSTILE}}
    # a simple-form candidate writes its own reply, cascade stages and their metric names and values included
    evaluation |= {"stages": [{"stage": 1, "metrics": {HOSTILE: 1.5, "note": "a-string"}}]}
    pid, _ = store_program(archive, run.id, CANDIDATE, evaluation=evaluation)
    archive.close()
    shown = CliRunner().invoke(app, ["show", str(tmp_path / "a.db"), str(pid)])
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.output and "\x07" not in shown.output
    # the code (whose source spells it with escapes), the error, feedback, case error, stderr, the stage's metric
    assert shown.output.count("\\x1b[31mscalar view 1 ok[/red] [/]") == 6, shown.output
    assert "scalar view 1 ok[/red] [/] 1.5, note a-string" in shown.output


def test_evolve_inspect_prints_a_hostile_incident_as_inert_text(tmp_path: Path) -> None:
    """An incident's message holds what failed: model output or an evaluator's error, as written."""
    from evolve.archive import Archive

    folder = write_problem(tmp_path / "p")
    archive = Archive(tmp_path / "a.db")
    fitness = {"components": [{"name": "c0", "bounds": [0.0, 1.0]}]}
    run = archive.create_run("p", str(folder), "fp", {"problem": {"fitness": fitness}, "options": {}}, 0)
    archive.add_incident(run.id, "generate", "parse", HOSTILE)
    archive.close()
    shown = CliRunner().invoke(app, ["inspect", str(tmp_path / "a.db")])
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.output and "\x07" not in shown.output
    assert (
        "last incident: generate: parse: \\x1b[2J\\x1b]0;owned\\x07\\x1b[31mscalar view 1 ok[/red] [/]" in shown.output
    )
