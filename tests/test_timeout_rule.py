"""The per-evaluation timeout of a problem that sets none follows from the seed's own time (evolve/problem/
timeout_rule.py): a child that loops forever is cut at that timeout, not at OpenEvolve's 300 s; a problem's
`[limits] timeout_s` and the command line's `--timeout` still win, and the run's opening lines say which holds.

The runs are the real `evolve run` on the process sandbox with a replay policy whose one child spins forever.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from evolve.problem.timeout_rule import CEILING_S, FLOOR_S, TimeoutChoice, derived, stored_choice
from tests.forked_cli import FORKED
from tests.helpers import db_rows

SEED = '''"""Seed: square the input, slowly (about 0.2 s)."""
import time


# EVOLVE-BLOCK-START
def solve(x):
    time.sleep(0.2)
    return x + 1
# EVOLVE-BLOCK-END
'''

EVALUATOR = """import importlib.util


def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("candidate", program_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {"combined_score": float(module.solve(3) == 9)}
"""

SPINNER = "import time\n\n\ndef solve(x):\n    while True:\n        pass\n"


def _openevolve_folder(root: Path, config: str | None = None) -> Path:
    root.mkdir(parents=True)
    (root / "initial_program.py").write_text(SEED)
    (root / "evaluator.py").write_text(EVALUATOR)
    if config is not None:
        (root / "config.yaml").write_text(config)
    return root


def _native_folder(root: Path, timeout_s: float) -> Path:
    root.mkdir(parents=True)
    (root / "problem.toml").write_text(
        'name = "slowseed"\ndescription = "square"\n[program]\nfile = "initial_program.py"\n'
        '[evaluator]\nfile = "evaluator.py"\nform = "simple"\n'
        '[fitness]\ncomponents = [{ name = "combined_score", bounds = [0.0, 1.0] }]\n'
        f"[limits]\ntimeout_s = {timeout_s}\n"
    )
    (root / "initial_program.py").write_text(SEED)
    (root / "evaluator.py").write_text(EVALUATOR)
    return root


def _run(tmp_path: Path, folder: Path, *extra: str, within_s: float) -> tuple[str, float]:
    """`evolve run` of the seed and one spinning child; (its output, the child's evaluation seconds)."""
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([f"<variant 1>\n```python\n{SPINNER}```\n</variant 1>\n"]))
    db = tmp_path / "a.db"
    cmd = ["run", str(folder), "--db", str(db), "--policy", f"replay:{replay}"]
    cmd += ["--sandbox", "process", "--allow-weak-sandbox", "--max-evaluations", "2", "--workers", "1"]
    cmd += ["--group-size", "1", "--variants", "1", "--edit-format", "full", "--no-stop-when-solved", *extra]
    started = time.monotonic()
    try:
        done = FORKED.run(cmd, timeout=within_s)  # a process of its own; the CLI's imports were made once
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the spinning child was not cut within {within_s:.0f} s: {str(exc.stdout)[-1500:]}")
    print(f"run took {time.monotonic() - started:.1f} s")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = db_rows(
        db,
        "SELECT evaluations.error_kind, evaluations.duration_s FROM evaluations JOIN programs ON programs.id = "
        "evaluations.program_id WHERE programs.parent_id IS NOT NULL",
    )
    assert len(rows) == 1 and rows[0][0] == "timeout", rows
    return done.stdout, rows[0][1]


def test_a_problem_without_a_timeout_cuts_a_looping_child_at_the_seeds_rule(tmp_path):
    folder = _openevolve_folder(tmp_path / "oe")
    out, child_s = _run(tmp_path, folder, within_s=150)
    stored = json.loads(db_rows(tmp_path / "a.db", "SELECT config FROM runs")[0][0])["timeout"]
    rule = derived(stored["seed_s"])
    print(f"seed {stored['seed_s']:.2f} s -> timeout {stored['timeout_s']:g} s; the child ran {child_s:.1f} s")
    # The seed sleeps 0.2 s: even with the sandbox's start on a busy machine its rule is far below OpenEvolve's 300 s
    assert stored["timeout_s"] == rule.timeout_s and FLOOR_S <= rule.timeout_s <= 60, stored
    assert rule.timeout_s - 0.5 <= child_s < rule.timeout_s + 10, child_s
    line = next((x for x in out.splitlines() if x.startswith("timeout ")), None)
    assert line == rule.line(), out[-2000:]
    assert line.startswith(f"timeout {rule.timeout_s:g} s: 10 x the seed's "), line
    assert line.endswith("(the problem sets none; --timeout overrides)"), line


def test_the_problems_own_timeout_wins(tmp_path):
    # Each setting here also bounds the seed's evaluation (0.2 s of work, a few seconds on a loaded machine: kept at
    # 6 s or more so a CI machine under the whole suite's load still scores the seed); each is below the rule's 10 s
    # floor, so that the line and the child's time tell the setting from the rule
    folder = _native_folder(tmp_path / "native", timeout_s=7)
    out, child_s = _run(tmp_path, folder, within_s=120)
    assert 6.5 <= child_s < 14, child_s
    assert "timeout 7 s: the problem's [limits] timeout_s (--timeout overrides)" in out, out[-2000:]


def test_an_openevolve_config_timeout_wins(tmp_path):
    folder = _openevolve_folder(tmp_path / "oe", config="evaluator:\n  timeout: 8\n  cascade_evaluation: false\n")
    out, child_s = _run(tmp_path, folder, within_s=120)
    assert 7.5 <= child_s < 15, child_s
    assert "timeout 8 s: the problem's" in out, out[-2000:]


def test_the_command_line_wins_over_the_rule(tmp_path):
    folder = _openevolve_folder(tmp_path / "oe")
    out, child_s = _run(tmp_path, folder, "--timeout", "6", within_s=120)
    assert 5.5 <= child_s < 13, child_s
    assert "timeout 6 s: --timeout" in out, out[-2000:]


def test_the_rule_floor_factor_and_ceiling():
    assert derived(0.05).timeout_s == FLOOR_S
    assert derived(2.5).timeout_s == 25.0 and derived(2.71).timeout_s == 28.0  # whole seconds, rounded up
    assert derived(100.0).timeout_s == CEILING_S
    assert "at most 300 s" in derived(100.0).line()


def test_a_resume_takes_the_stored_result_not_a_new_derivation():
    choice = derived(1.5)
    again = stored_choice({"timeout": choice.as_json()})
    assert again == TimeoutChoice(15.0, "seed", 1.5)
    assert stored_choice({}) is None and stored_choice({"timeout": {"timeout_s": "x"}}) is None
