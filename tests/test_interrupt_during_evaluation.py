"""Ctrl-C (or SIGTERM) while a candidate is being evaluated: the real `evolve run` exits within about a second,
the candidate is killed, its child is stored neither as evaluated nor as failed, and `evolve resume` evaluates it.

The candidate sleeps while the problem's data/ folder holds a file named `sleep` modified since 2000, and names
itself (prctl PR_SET_NAME, seen in the host's /proc/PID/comm) before it sleeps: the test signals the engine only
once the candidate surely runs, in the jail and in a container alike. The resume runs with the file dated 1970:
its content, all a resume compares of the folder (evolve/problem/fingerprint.py), is unchanged, so the run is
the same problem's, and the candidate returns at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from evolve.problem.samples import write_problem
from tests.helpers import db_rows
from tests.services import missing

pytestmark = pytest.mark.slow

EXIT_WITHIN_S = 2.0  # from the signal to the process's exit, candidate killed and state saved
TIMEOUT_S = 30.0  # the problem's own deadline: far beyond EXIT_WITHIN_S, so waiting for it would show

SLEEPER = """
import ctypes, os, time

def solve(x):
    if os.stat(os.path.join(os.environ["EVOLVE_DATA_DIR"], "sleep")).st_mtime > 946684800:  # since 2000
        ctypes.CDLL(None).prctl(15, {name!r}, 0, 0, 0)  # PR_SET_NAME: "I run now", for the test to see
        time.sleep(600)
    return x ** 2
"""


def _named(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_bytes().strip() == name.encode():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _problem(tmp_path: Path, name: str, *, sleepy_seed: bool) -> tuple[Path, Path]:
    """A problem whose seed (or only child) sleeps while data/sleep is new; the replay file of its child."""
    seed = "# EVOLVE-BLOCK-START\n" + SLEEPER.format(name=name.encode()) + "# EVOLVE-BLOCK-END\n"
    if not sleepy_seed:
        seed = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return x * x\n# EVOLVE-BLOCK-END\n"
    folder = write_problem(tmp_path / "prob", seed=seed, timeout=TIMEOUT_S, name="sleepy")
    (folder / "data").mkdir()
    (folder / "data" / "sleep").write_text("")
    child = SLEEPER.format(name=name.encode()) if not sleepy_seed else "def solve(x):\n    return x * x + 0 * x\n"
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([f"<variant 1>\n```python\n{child}```\n</variant 1>\n"]))
    return folder, replay


CASES = {
    "process-child-SIGINT": ("process", False, signal.SIGINT),
    "process-child-SIGTERM": ("process", False, signal.SIGTERM),
    "process-seed-SIGINT": ("process", True, signal.SIGINT),
    "docker-child-SIGINT": ("docker", False, signal.SIGINT),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_signal_during_evaluation_stops_at_once_and_resume_evaluates_the_child(tmp_path, case):
    sandbox, sleepy_seed, signum = CASES[case]
    if sandbox == "docker":
        from sandboxes.docker_pool import docker_available

        if (why := docker_available()) is not None:
            missing("Docker", why)
    name = f"sleepy-{uuid.uuid4().hex[:8]}"
    folder, replay = _problem(tmp_path, name, sleepy_seed=sleepy_seed)
    db = tmp_path / "a.db"
    cmd = [sys.executable, "-m", "evolve.cli", "run", str(folder), "--db", str(db), "--policy", f"replay:{replay}"]
    cmd += ["--sandbox", sandbox, "--max-evaluations", "2", "--workers", "1", "--group-size", "1"]
    cmd += ["--variants", "1", "--edit-format", "full", "--no-stop-when-solved"]
    if sandbox == "process":
        cmd += ["--allow-weak-sandbox"]  # about the loop: a machine without bubblewrap runs it too
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 180
        while not _named(name) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _named(name), f"the candidate never ran: {proc.poll()} {proc.stdout.read() if proc.poll() else ''}"
        time.sleep(0.3)  # well into its sleep
        sent = time.monotonic()
        proc.send_signal(signum)
        try:
            proc.wait(timeout=TIMEOUT_S + 30)
        finally:
            took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stdout.read()
    print(f"{case}: exited {took:.2f}s after the signal")
    assert took < EXIT_WITHIN_S, f"took {took:.1f}s to stop: {out[-1500:]}"
    assert proc.returncode == 0 and "interrupted" in out and "Traceback" not in out, out[-3000:]
    time.sleep(0.5)
    assert _named(name) == [], "the candidate outlived the engine"

    # Nothing stored for what was running: no evaluation, no failure, no incident; the run is `stopped`.
    assert db_rows(db, "SELECT status FROM runs") == [("stopped",)]
    assert db_rows(db, "SELECT COUNT(*) FROM evaluations") == [(0 if sleepy_seed else 1,)]
    assert db_rows(db, "SELECT COUNT(*) FROM evaluations WHERE error_kind IS NOT NULL") == [(0,)]
    assert db_rows(db, "SELECT COUNT(*) FROM incidents") == [(0,)]
    if not sleepy_seed:
        assert db_rows(db, "SELECT COUNT(*) FROM variants WHERE status = 'ok' AND program_id IS NULL") == [(1,)]

    os.utime(folder / "data" / "sleep", (0, 0))
    again = subprocess.run(
        [sys.executable, "-m", "evolve.cli", "resume", str(db)], capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert "evaluation budget reached" in again.stdout, again.stdout[-2000:]
    scores = db_rows(db, "SELECT programs.parent_id IS NULL, scores, error_kind FROM evaluations JOIN programs"
                   " ON programs.id = evaluations.program_id ORDER BY programs.id")  # fmt: skip
    assert [(bool(seed), json.loads(s), e) for seed, s, e in scores] == [
        (True, {"c0": 1.0, "c1": 1.0}, None),
        (False, {"c0": 1.0, "c1": 1.0}, None),
    ]
    assert db_rows(db, "SELECT COUNT(*) FROM variants WHERE status = 'ok' AND program_id IS NULL") == [(0,)]
    assert db_rows(db, "SELECT status FROM runs") == [("finished",)]
