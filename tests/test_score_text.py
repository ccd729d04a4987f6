"""Scores as the CLI prints them: six significant digits, never rounded onto a round number they are not."""

from __future__ import annotations

import subprocess
import sys

from evolve.fitness import score_text
from tests.helpers import SPLIT_EVAL, write_problem


def test_a_score_just_under_a_bound_is_not_shown_as_the_bound():
    assert score_text(0.999999995) == "0.999999995"
    assert score_text(0.4999999991) == "0.4999999991"
    assert score_text(1.0) == "1" and score_text(0) == "0" and score_text(-3.0) == "-3"
    assert score_text(0.1234567891) == "0.123457"  # not a round number: six digits as before
    assert score_text(1234567.0) == "1234567"  # six digits would have rounded it onto 1234570


def test_check_shows_a_seed_just_short_of_solving_as_short_of_it(tmp_path):
    """A user read "best scalar 1" on a run that (rightly) did not stop as solved: its best was 0.999999995."""
    evaluate = SPLIT_EVAL.replace(
        'return (1.0 if output == case["expected"] else 0.0), repr(output)[:2000]', "return 0.999999995"
    )
    folder = write_problem(tmp_path / "p", evaluate=evaluate)
    command = [sys.executable, "-m", "evolve.cli", "check", str(folder), "--sandbox", "process", "--allow-weak-sandbox"]
    out = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "scalar view 0.999999995," in out.stdout
