"""OpenEvolve-style folders (tests/openevolve_folders/) run unchanged: check, eval and a short replay search,
in the process sandbox and in Docker, through the real command line and a real SQLite archive."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.cli import app

FOLDERS = Path(__file__).with_name("openevolve_folders")
SQUARE = "x * x"
# Four distinct children: exact, half right, exact written differently, and one that raises at x == 3.
CHILDREN = ("x * x", "x * 2", "x ** 2 if x >= 0 else 0", "1 / 0 if x == 3 else x * x")


def _program(expr: str) -> str:
    return f"# EVOLVE-BLOCK-START\ndef solve(x):\n    return {expr}\n# EVOLVE-BLOCK-END\n"


def _completion(exprs: tuple[str, str]) -> str:
    return "".join(
        f"<variant {k}>\n```python\ndef solve(x):\n    return {e}\n```\n</variant {k}>\n"
        for k, e in enumerate(exprs, start=1)
    )


# What the exact child scores in each folder, and what the child that raises at x == 3 leaves behind.
EXPECT = {
    "plain_dict": {"exact": {"exact": 1.0, "close": 1.0}, "raising": "crash"},
    "artifacts": {"exact": {"combined_score": 1.0, "correct": 8.0}, "raising": "crash"},
    "error_keys": {"exact": {"combined_score": 1.0, "exact": 1.0, "closeness": 1.0}, "raising": "error"},
    "cascade": {
        "exact": {"runs": 1.0, "small": 1.0, "medium": 1.0, "large": 1.0, "combined_score": 1.0},
        "raising": "stage2",
    },
    "configured": {"exact": {"combined_score": 1.0, "accuracy": 1.0, "brevity": None}, "raising": "crash"},
}


def _cli(*args: str) -> object:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result


def _docker_or_missing() -> None:
    from sandboxes.docker_pool import docker_available
    from tests.services import missing

    reason = docker_available()
    if reason is not None:
        missing("Docker", reason)


def _rows(db: Path) -> dict[str, dict]:
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT p.id, p.code, e.scores, e.scalar, e.error_kind, e.error, e.feedback, e.stages "
            "FROM programs p JOIN evaluations e ON e.program_id = p.id"
        ).fetchall()
    out = {}
    for pid, code, scores, scalar, kind, error, feedback, stages in rows:
        key = next((e for e in CHILDREN if f"return {e}\n" in code), "seed")
        out[key] = dict(
            id=pid,
            scores=json.loads(scores),
            scalar=scalar,
            kind=kind,
            error=error,
            feedback=feedback or "",
            stages=json.loads(stages) if stages else None,
        )
    return out


def _exact_scores(folder: str, code: str) -> dict[str, float]:
    want = dict(EXPECT[folder]["exact"])
    if "brevity" in want:
        want["brevity"] = 100.0 / len(code)  # the configured folder's evaluator: 100 / characters
    return want


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["process", pytest.param("docker", marks=pytest.mark.docker)])
@pytest.mark.parametrize("folder", sorted(EXPECT))
def test_openevolve_folder_runs_unchanged(tmp_path, folder, sandbox):
    if sandbox == "docker":
        _docker_or_missing()
    src = FOLDERS / folder
    before = sorted(p.name for p in src.iterdir())

    checked = _cli("check", str(src), "--sandbox", sandbox)
    assert checked.exit_code == 0, checked.stderr
    assert f"{len(EXPECT[folder]['exact'])} components" in checked.stdout

    program = tmp_path / "square.py"
    program.write_text(_program(SQUARE))
    scored = _cli("eval", str(src), str(program), "--sandbox", sandbox, "--json")
    assert scored.exit_code == 0, scored.stderr
    reply = json.loads(scored.stdout)
    assert reply["error_kind"] is None and reply["scores"] == _exact_scores(folder, program.read_text())

    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([_completion(CHILDREN[:2]), _completion(CHILDREN[2:])]))
    db = tmp_path / "run.db"
    args = ["run", str(src), "--db", str(db), "--policy", f"replay:{replay}", "--sandbox", sandbox]
    args += ["--workers", "1", "--group-size", "2", "--variants", "2", "--max-evaluations", "5"]
    # a child solves it, and the replayed texts repeat: only the budget may end this run
    args += ["--edit-format", "full", "--no-stop-when-solved", "--stall-groups", "1000"]
    ran = _cli(*args)
    assert ran.exit_code == 0, ran.stdout + ran.stderr
    assert "evaluation budget reached" in ran.stdout, ran.stdout
    assert sorted(p.name for p in src.iterdir()) == before  # the folder is left as it was

    rows = _rows(db)
    assert set(rows) == {"seed", *CHILDREN}
    exact = rows[SQUARE]
    seed_code = (src / "initial_program.py").read_text()
    assert exact["kind"] is None and exact["scores"] == _exact_scores(folder, seed_code.replace("x + 1", SQUARE))
    other = rows["x ** 2 if x >= 0 else 0"]["scores"]
    assert other == _exact_scores(folder, seed_code.replace("x + 1", "x ** 2 if x >= 0 else 0"))
    raising = rows[CHILDREN[3]]
    expected_fail = EXPECT[folder]["raising"]
    if expected_fail == "crash":
        assert raising["kind"] == "crash" and "ZeroDivisionError" in raising["error"]
    elif expected_fail == "error":
        # Other keys on failure: scored, missing components at their fail value, the error text kept.
        assert raising["kind"] is None
        assert raising["scores"] == {"combined_score": 0.0, "exact": 0.0, "closeness": 0.0}
        assert "error: ZeroDivisionError: division by zero" in raising["feedback"]
        assert "outputs: [0, 1, 4, 9, 16, 25]" in exact["feedback"]  # a list-valued metric is feedback
    else:
        # Stage 1 passed, stage 2 raised: stage 1's metrics stand, the rest fail, and the model is told why.
        assert raising["kind"] is None
        assert raising["stages"] == [{"stage": 1, "metrics": {"runs": 1.0, "small": 1.0}}]
        assert raising["scores"] == {"runs": 1.0, "small": 1.0, "medium": 0.0, "large": 0.0, "combined_score": 0.0}
        assert "stage 2 raised ZeroDivisionError" in raising["feedback"]
        assert exact["stages"] == [
            {"stage": 1, "metrics": {"runs": 1.0, "small": 1.0}},
            {"stage": 2, "metrics": {"medium": 1.0}},
            {"stage": 3, "metrics": {"large": 1.0, "combined_score": 1.0}},
        ]
        # x * 2 is right at 0 and 2 only: stage 1 passes (2/3 >= 0.6), stage 2 scores 0, so the merged mean
        # (1 + 2/3 + 0) / 3 is below 0.9 and stage 3 never runs.
        half = rows["x * 2"]
        assert [s["stage"] for s in half["stages"]] == [1, 2] and half["scores"]["large"] == 0.0
        assert "cascade stopped after stage 2: score 0.555556 below threshold 0.9" in half["feedback"]
        shown = _cli("show", str(db), str(exact["id"]))
        assert "stage 2: medium 1" in shown.stdout and "stage 3: large 1, combined_score 1" in shown.stdout
    if folder == "artifacts":
        assert "wrong_inputs: solve(x) != x*x for x in [1, 3, 4, 5, 6, 7]" in rows["x * 2"]["feedback"]
    # combined_score, when returned, is the scalar view; otherwise the mean of the metrics.
    assert exact["scalar"] == 1.0 and rows["seed"]["scalar"] == (0.15 if folder == "plain_dict" else 0.0)

    again = _cli(*args)  # the same command resumes the same run (same inferred problem), adding nothing
    assert again.exit_code == 0, again.stderr
    assert len(_rows(db)) == 5
