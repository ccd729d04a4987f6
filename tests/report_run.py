"""A real, small search for the report tests: the square problem, a replay policy, the process sandbox.

The replayed answers include a partial solution per test case, a crash, an unparseable answer and the only
perfect program, whose code and stdout carry a script-injection payload: the report must show it as text.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.helpers import evolve_run_cmd, write_square_problem

HOSTILE = "</script><script>alert(1)</script>"


def _variant(k: int, body: str) -> str:
    return f"<variant {k}>\n```python\n{body}```\n</variant {k}>\n"


def replay_answers() -> list[str]:
    only_c0 = "def solve(x):\n    return 4 if x == 2 else 0\n"
    only_c1 = "def solve(x):\n    return 9 if x == 3 else 0\n"
    crash = "def solve(x):\n    raise RuntimeError('no idea')\n"
    hostile = f"def solve(x):\n    print({HOSTILE!r})  # {HOSTILE}\n    return x * x\n"
    return [
        _variant(1, only_c0) + "<variant 2>\nno code here\n</variant 2>\n",
        _variant(1, only_c1) + _variant(2, crash),
        _variant(1, hostile) + _variant(2, only_c0),
    ]


def make_report_run(root: Path, evaluations: int = 6) -> Path:
    """Run `evolve run` to its budget and return the archive's path."""
    folder = write_square_problem(root / "square")
    replay = root / "replay.json"
    replay.write_text(json.dumps(replay_answers()))
    db = root / "runs.db"
    out = subprocess.run(
        evolve_run_cmd(folder, db, f"replay:{replay}", evaluations, "--workers", "2"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return db


def add_policy_update(db: Path) -> None:
    """Record one policy update with statistics, written the way the trainer writes it."""
    from evolve.archive import Archive

    archive = Archive(db, create=False)
    run = archive.runs()[-1]
    base = archive.policy_versions(run.id)[0]
    archive.add_policy_version(
        run_id=run.id,
        base_model=base.base_model,
        adapter_path="/adapters/v1",
        parent_id=base.id,
        number=1,
        stats={
            "loss": 0.12,
            "clip_fraction": 0.05,
            "kl": 0.01,
            "set_reward_mean": 0.4,
            "set_reward_std": 0.2,
            "reward_diversity": 0.3,
        },
    )
    archive.close()
