"""The line a run ends with: the run's totals, as `evolve inspect` counts them, and this session's own figures.

A helper resumed a run and read "5 evaluations (0 this session), 6 groups, parse ok 0/24, eval errors 0" beside
inspect's 48 variants and one crash: totals and session counts in one unlabelled line.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.helpers import evolve_run_cmd, write_square_problem
from tests.report_run import replay_answers

FRESH = re.compile(
    r"group budget reached: (\d+) evaluations \((\d+) failed\), (\d+) groups, best scalar .*, "
    r"(\d+) new programs of (\d+) variants"
)
RESUMED = re.compile(
    r"group budget reached: (\d+) evaluations and (\d+) groups in all, best scalar .*; this session (\d+) "
    r"evaluations \((\d+) failed\) and (\d+) groups: .*, (\d+) new programs of (\d+) variants"
)


def _final_line(command: list[str], pattern: re.Pattern[str]) -> tuple[int, ...]:
    out = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    found = [m for line in out.stdout.splitlines() if (m := pattern.match(line))]
    assert len(found) == 1, out.stdout[-3000:]
    return tuple(int(g) for g in found[0].groups())


def test_a_resumed_runs_final_line_names_the_runs_totals_and_this_sessions_figures(tmp_path):
    folder = write_square_problem(tmp_path / "square")
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps(replay_answers()))
    db = tmp_path / "a.db"
    first = _final_line(
        evolve_run_cmd(folder, db, f"replay:{replay}", 40, "--max-groups", "3", "--no-stop-when-solved"), FRESH
    )
    resume = [sys.executable, "-m", "evolve.cli", "resume", str(db), "--max-groups", "6"]
    second = _final_line(resume, RESUMED)
    inspected = json.loads(
        subprocess.run(
            [sys.executable, "-m", "evolve.cli", "inspect", str(db), "--json"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    )[0]
    evaluations, failed, groups, new, variants = first
    assert groups == 3 and evaluations >= 2 and variants > 0
    total_evaluations, total_groups, session_evaluations, session_failed, session_groups, new2, variants2 = second
    assert (
        (total_evaluations, total_groups)
        == (inspected["evaluations"], inspected["groups"])
        == (
            evaluations + session_evaluations,
            6,
        )
    )
    assert session_groups == 3
    assert failed + session_failed == sum(inspected["errors"].values())
    assert variants + variants2 == sum(inspected["variants"].values())
    assert new + new2 == inspected["variants"]["ok"]
