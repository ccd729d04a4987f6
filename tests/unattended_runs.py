"""What the unattended-run tests share: `evolve` in a subprocess, a folder from `evolve init`, replayed answers.

The tests of runs left alone (a stray marker, a broken part, a kill, a stop rule) are split by what they check:
test_unattended_markers.py, _resume, _case_feedback, _stops, _incidents, _signals, _jail. Real parts throughout:
`evolve` in a subprocess, a real SQLite archive, the process sandbox, a replay policy. Their folder from
`evolve init` is conftest's `initialised` fixture.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

EVOLVE = [sys.executable, "-m", "evolve.cli"]

STRAY_END = (
    "<variant 1>\n```python\ndef solve(x):\n    return x * 2\n# EVOLVE-BLOCK-END\n```\n</variant 1>\n"
    "<variant 2>\n```python\ndef solve(x):\n    return x + 3\n```\n</variant 2>\n"
    "<variant 3>\n<<<<<<< SEARCH\n    return x\n=======\n    return x - 1\n# EVOLVE-BLOCK-START\n"
    ">>>>>>> REPLACE\n</variant 3>"
)


def varied(n: int) -> list[str]:
    """n completions, each with one new valid child, and the stray markers between them."""
    return [STRAY_END] + [
        f"<variant 1>\n```python\ndef solve(x):\n    return x * {k} + 1\n```\n</variant 1>" for k in range(n)
    ]


def evolve(*args: str, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLVE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def init_with_replay(tmp_path: Path, initialised: Path, texts: list[str]) -> tuple[Path, Path]:
    folder = tmp_path / "demo"
    shutil.copytree(initialised, folder)
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps(texts))
    return folder, replay


def unique_children(n: int) -> list[str]:
    """n completions of three new, valid children each."""
    return [
        "".join(
            f"<variant {i}>\n```python\ndef solve(x):\n    return x * {3 * k + i} - {k}\n```\n</variant {i}>\n"
            for i in (1, 2, 3)
        )
        for k in range(n)
    ]


def run_replay(
    tmp_path: Path, initialised: Path, texts: list[str], *extra: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    folder, replay = init_with_replay(tmp_path, initialised, texts)
    db = tmp_path / "d.db"
    out = evolve(
        "run", str(folder), "--db", str(db), "--policy", f"replay:{replay}", "--sandbox", "process",
        "--workers", "1", *extra,
    )  # fmt: skip
    return out, db


def pending_children(db: Path) -> int:
    con = sqlite3.connect(db)
    return con.execute("SELECT COUNT(*) FROM variants WHERE status = 'ok' AND program_id IS NULL").fetchone()[0]


def hidden_expr(evaluator: str) -> str:
    found = re.search(r'"expected": (.+?)}', evaluator)  # the hidden f(x) of `evolve init`
    assert found, evaluator
    return found.group(1).strip()
