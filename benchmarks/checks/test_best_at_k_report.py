"""best@k's report pairs policies prompt by prompt: every policy answered the same prompts with the same seeds, so
a trained policy's gain is the mean of its per-prompt differences from the untrained one. Each results file is one
training; pooled lines join the trained problems' prompts, and the held-out ones', never one with the other."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from benchmarks.best_at_k import Measured
from benchmarks.best_at_k_report import contrast, load, report


def measured(policy: str, problem: str, gains: list[list[float]]) -> Measured:
    return Measured(policy=policy, problem=problem, gains=gains, variants=6, new_valid=2, copies=1)


def results(path: Path, *rows: Measured) -> Path:
    path.write_text(json.dumps([asdict(r) for r in rows]))
    return path


def test_the_contrast_is_per_prompt_and_counts_the_prompts_that_rose() -> None:
    none = measured("none", "p", [[0.0, 0.1], [0.2, 0.2], [0.0, 0.0]])
    vpo = measured("vpo", "p", [[0.1, 0.4], [0.2, 0.2], [0.0, 0.0]])
    assert contrast(vpo, none, 2) == "best@2 vpo-none=+0.1000 [+0.0000, +0.3000] (1 of 3 above 0)"
    assert contrast(vpo, none, 1).startswith("best@1 vpo-none=+0.0333 ")


def test_trainings_are_pooled_by_role_and_the_same_held_out_problem_is_not_merged(tmp_path: Path) -> None:
    first = results(
        tmp_path / "a.json",
        measured("none", "a", [[0.0, 0.1]]),
        measured("none", "held", [[0.0, 0.0]]),
        measured("vpo", "a", [[0.0, 0.3]]),
        measured("vpo", "held", [[0.0, 0.2]]),
    )
    second = results(
        tmp_path / "b.json",
        measured("none", "b", [[0.0, 0.5]]),
        measured("none", "held", [[0.0, 0.4]]),
        measured("vpo", "b", [[0.0, 0.5]]),
        measured("vpo", "held", [[0.0, 0.4]]),
    )
    lines = report(load([first, second]))
    assert "best_at_k_held_out none=0.0000 vpo=0.2000 k=2 problem=held" in lines  # the first file's own
    assert "best_at_k_held_out none=0.4000 vpo=0.4000 k=2 problem=held" in lines  # the second's, not overwritten
    assert "best_at_k none=0.3000 vpo=0.4000 k=2 problem=a+b" in lines
    assert lines[-1] == "best_at_k_held_out none=0.2000 vpo=0.3000 k=2 problem=held+held"
    assert "  vpo   0.0000 0.4000 4/12 2/12" in lines
    assert "  best@2 vpo-none=+0.1000 [+0.0000, +0.2000] (1 of 2 above 0)" in lines
