"""A member whose children all score nothing is not shown as productive: per member, `evolve inspect --json`
counts its zero children (the worst value on every component) apart and none of them as valid or improved.

Real parts: replay members (no model), the process sandbox, a SQLite archive and the command-line app."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.options import RunOverrides
from evolve.problem import load_problem
from evolve.problem.samples import write_problem
from evolve.search import build_search
from tests.test_ensemble import COUNT_EVAL, COUNT_TOML, SEED, _answer


@pytest.mark.slow  # about 8 evaluations in the process sandbox: a few seconds
def test_a_member_whose_children_score_zero_has_no_valid_child(tmp_path: Path) -> None:
    folder = write_problem(tmp_path / "count", seed=SEED, evaluate=COUNT_EVAL, toml=COUNT_TOML)
    members = {
        "up": [_answer(f"def solve(x):\n    return {k}\n") for k in range(2, 60)],
        # new code every time (so never a duplicate), and a score clamped to 0: the worst bound of `n`
        "zero": [_answer(f"def solve(x):\n    return -{k}\n") for k in range(2, 60)],
    }
    specs = {}
    for role, texts in members.items():
        (tmp_path / f"{role}.json").write_text(json.dumps(texts))
        specs[role] = f"replay:{tmp_path / f'{role}.json'}"
    db = tmp_path / "a.db"
    given = RunOverrides(sandbox="process", workers=1, max_evaluations=9, seed=1, allocation="uniform")
    search = build_search(load_problem(folder), given, db=db, policies=[specs["up"], specs["zero"]])
    try:
        search.run()
    finally:
        search.close()
    from evolve.cli import app

    shown = CliRunner().invoke(app, ["inspect", str(db), "--json"], catch_exceptions=False)
    assert shown.exit_code == 0, shown.output
    [summary] = json.loads(shown.stdout)
    by_name = {m["name"]: m for m in summary["members"]}
    up, zero = by_name[specs["up"]], by_name[specs["zero"]]
    # one variant a group; the budget's last group may go unevaluated
    assert zero["zero"] >= 3 and zero["valid"] == 0 and zero["improved"] == 0 and zero["best_scalar"] is None
    assert up["zero"] == 0 and up["valid"] >= 3 and up["improved"] > 0
    assert zero["zero"] + up["valid"] == 8  # the 9 evaluations: the seed and 8 children
    assert summary["quality"]["zero"] == zero["zero"] and summary["quality"]["evaluated"] == 8
    text = CliRunner().invoke(app, ["inspect", str(db)], catch_exceptions=False).stdout
    assert f"0 new valid, 0 improved, {zero['zero']} scored nothing" in " ".join(text.split())
