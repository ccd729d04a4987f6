"""SIGTERM while `evolve run --train-every N` updates the policy: the real process gives the update up between two
samples and exits within seconds (it used to finish the update first: minutes on a CPU), the run is `stopped` with
a reason that says so, no version or adapter directory is left, and the run state keeps the groups counted towards
the next update, so that the resumed run trains after its first group.

The update is made long against sampling: 16 completions a group, each trained on one sequence at a time
(prompt and completion, forward and backward), against one batched generation of the 16."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time

import pytest

from tests.helpers import db_rows, evolve_run_cmd, write_square_problem

pytestmark = pytest.mark.slow

EXIT_WITHIN_S = 3.0  # from the signal to the exit: one sample's pass (~0.2 s here, more under load) and the state
TRAINING = ["--group-size", "16", "--variants", "1", "--train-every", "2", "--keep-zero-advantage", "--asks", "base"]


def _wait_for(lines: queue.Queue, text: str, proc: subprocess.Popen, seen: list[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=0.5)
        except queue.Empty:
            assert proc.poll() is None, f"exited {proc.returncode} before {text!r}: {''.join(seen)[-3000:]}"
            continue
        seen.append(line)
        if text in line:
            return
    raise AssertionError(f"no {text!r} within {timeout_s}s: {''.join(seen)[-3000:]}")


def test_sigterm_during_an_update_abandons_it_at_once_and_keeps_the_count_for_the_resume(tmp_path, tiny_model_dir):
    folder, db = write_square_problem(tmp_path / "sq"), tmp_path / "a.db"
    policy = f"transformers:{tiny_model_dir}"
    env = {**os.environ, "EVOLVE_PROGRESS_EVERY_S": "0.1"}  # a summary line every 0.1 s: it says "updating"
    cmd = evolve_run_cmd(folder, db, policy, 200, *TRAINING)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    seen: list[str] = []
    try:
        _wait_for(lines, "updating the policy", proc, seen, timeout_s=240)
        time.sleep(0.3)  # into the samples' passes
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        finally:
            took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    time.sleep(0.2)  # the reader thread drains the pipe
    while not lines.empty():
        seen.append(lines.get())
    out = "".join(seen)
    print(f"exited {took:.2f}s after SIGTERM")
    assert took < EXIT_WITHIN_S, f"took {took:.1f}s to stop: {out[-2000:]}"
    assert proc.returncode == 0 and "Traceback" not in out, out[-3000:]
    assert "interrupted during a policy update: the update was abandoned" in out, out[-2000:]
    [(status, state)] = db_rows(db, "SELECT status, state FROM runs")
    assert status == "stopped" and "the update was abandoned" in state
    assert db_rows(db, "SELECT number, adapter_path FROM policy_versions") == [(0, None)]
    adapters = tmp_path / "a.adapters"
    assert not adapters.exists() or list(adapters.iterdir()) == []  # no vN/ nor vN.partial/

    # The resume trains after its first group: the count of groups since the last update is kept in the run's state
    # (a resume that trains is in tests/test_versions.py: the step after an abandoned one records v1).
    assert json.loads(state)["groups_since_train"] >= 2
