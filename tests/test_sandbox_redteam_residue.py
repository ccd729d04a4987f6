"""The red team's findings, replayed, on what a job leaves behind: the jail's work folder capped in total, work
folders of dead engines, kernel keyrings, a process whose leader thread exited, and replies or trees too large to
store whole. Each attack is followed by known programs whose exact vectors are asserted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from evolve.problem import load_problem
from sandboxes.process import ProcessSandbox
from tests.helpers import docker_sandbox_or_skip, hiding_sandbox, weak_sandbox_or_skip
from tests.test_sandbox_redteam import (
    MIN_EVAL,
    MIN_KNOWN,
    MIN_TOML,
    REPLY_FD,
    SIMPLE_EVAL,
    SIMPLE_KNOWN,
    SIMPLE_TOML,
    assert_vectors,
    folder,
)


@pytest.fixture(scope="module")
def process_box():
    box = hiding_sandbox("process", slots=1)
    yield box
    box.close()


FILL_WORK = """import os
def solve(x):
    written = 0
    try:
        for i in range(64):
            with open(f"/work/fill{x}_{i}", "wb") as f:
                for _ in range(8):
                    f.write(b"x" * (1 << 20))
                    written += 1 << 20
    except OSError:
        pass
    for name in os.listdir("/work"):
        if name.startswith("fill"):
            os.unlink(f"/work/{name}")
    return x * x if 200 << 20 < written < 300 << 20 else -1
"""


def test_the_jailed_work_dir_is_capped_in_total(tmp_path, process_box):
    """Many files each under RLIMIT_FSIZE once filled the host's disk; now /work is a 256 MiB tmpfs per job."""
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    outcome = process_box.evaluate(problem, FILL_WORK)
    assert outcome.scores == {"c0": 0.0, "c1": 0.0}, (outcome.case_errors, outcome.error)
    assert_vectors(process_box, problem, MIN_KNOWN)


def test_work_dirs_of_dead_engines_are_removed_at_start():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = Path(tempfile.gettempdir()) / f"evolve-eval-{dead.pid}-redteam"
    stale.mkdir()
    (stale / "seed.py").write_text("x")
    live = Path(tempfile.gettempdir()) / f"evolve-eval-{os.getppid()}-live"
    live.mkdir()
    try:
        ProcessSandbox(slots=1).close()
        assert not stale.exists() and live.exists()
    finally:
        shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(live, ignore_errors=True)


KEYRING = """import ctypes, os
def solve(x):
    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
    add = libc.syscall(nr[0], b"user", b"evolve-left", b"secret", 6, -4)  # KEY_SPEC_USER_KEYRING
    add_errno = ctypes.get_errno()
    ctl = libc.syscall(nr[1], 0, -4, 0)  # KEYCTL_GET_KEYRING_ID
    denied = add == -1 and add_errno == 1 and ctl == -1 and ctypes.get_errno() == 1
    return x * x if denied else -1
"""


def test_kernel_keyrings_are_out_of_reach_in_the_jail(tmp_path, process_box):
    """Keys outlive processes and are keyed by the slot's uid; the jail's seccomp filter refuses the calls."""
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    outcome = process_box.evaluate(problem, KEYRING)
    assert outcome.scores == {"c0": 0.0, "c1": 0.0}, (outcome.case_errors, outcome.error)
    assert_vectors(process_box, problem, MIN_KNOWN)


ZOMBIE_LEADER = """import ctypes, glob, os, threading, time
PERFECT = "def solve(x):\\n    return x * x\\n"
def _rewrite(mine):
    end = time.time() + 20
    while time.time() < end:
        folder = os.path.dirname(os.path.dirname(mine))
        for path in [mine] + glob.glob(folder + "/evolve-eval-*/" + os.path.basename(mine)):
            try:
                if open(path).read() != PERFECT:
                    with open(path + ".x", "w") as f:
                        f.write(PERFECT)
                    os.rename(path + ".x", path)
            except OSError:
                pass
        time.sleep(0.01)
def solve(x):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            threading.Thread(target=_rewrite, args=(os.path.abspath(__file__),)).start()
            time.sleep(0.2)
            ctypes.CDLL(None).syscall(60, 0)  # SYS_exit of the leader thread alone: /proc shows it as "Z"
        os._exit(0)
    time.sleep(0.5)
    return x
"""


@pytest.mark.parametrize("backend", ["docker", "process-without-jail"])
def test_a_process_whose_leader_thread_exited_does_not_outlive_its_job(tmp_path, backend):
    """Its other threads keep running under a "Z" state: were it skipped as dead, it would rewrite every later
    candidate's program into a perfect one."""
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    box = docker_sandbox_or_skip(workers=1) if backend == "docker" else weak_sandbox_or_skip(slots=1)
    try:
        assert box.evaluate(problem, ZOMBIE_LEADER).scores == {"c0": 2.0, "c1": 6.0}
        for _ in range(3):
            assert_vectors(box, problem, list(reversed(MIN_KNOWN)))
    finally:
        box.close()


BLOATED_REPLY = f"""import json, os, sys
def solve(x):
    error = "E" * 300_000
    os.write({REPLY_FD}, (json.dumps({{"outputs": {{"c0": {{"kind": "crash", "error": error}},
                                                   "c1": {{"kind": "crash", "error": error}}}}}}) + "\\n").encode())
    os._exit(0)
"""


@pytest.mark.parametrize("backend", ["process", "docker"])
def test_a_reply_with_huge_case_errors_is_stored_bounded(tmp_path, backend):
    """What a candidate writes ends in the archive and in prompts: each case error is cut to 500 characters."""
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    box = docker_sandbox_or_skip(workers=1) if backend == "docker" else hiding_sandbox("process", slots=1)
    try:
        outcome = box.evaluate(problem, BLOATED_REPLY)
        assert outcome.scores == {"c0": 1e6, "c1": 1e6}
        assert sorted(outcome.case_errors) == ["c0", "c1"]
        assert all(len(e) == 500 and set(e) == {"E"} for e in outcome.case_errors.values())
        assert_vectors(box, problem, MIN_KNOWN)
    finally:
        box.close()


def test_a_simple_form_reply_is_stored_bounded(tmp_path, process_box):
    """The simple form's evaluator runs beside the candidate, so its feedback, metrics and stages are bounded."""
    problem = load_problem(folder(tmp_path / "s", SIMPLE_TOML, SIMPLE_EVAL))
    forged = (
        "def forged():\n"
        "    big = {f'm{i}': float(i) for i in range(5000)}\n"
        "    return {'exact': 0.5, 'close': 0.5, 'error': 'x' * 100_000, **big}\n"
    )
    outcome = process_box.evaluate(problem, forged)
    assert outcome.scores == {"exact": 0.5, "close": 0.5}
    assert len(outcome.metrics) == 256 and len(outcome.feedback or "") <= 8192
    assert_vectors(process_box, problem, SIMPLE_KNOWN)


DEEP_HIDDEN = """import os
def solve(x):
    if x != 2:
        return x
    for entry in os.scandir("/work"):  # our own job files go first: their pages become ours
        if entry.is_file():
            os.unlink(entry.path)
    os.chdir("{top}")
    for i in range(18):  # 18 names of 255 characters: the path is longer than PATH_MAX
        os.mkdir(("d%02d" % i) * 85)
        os.chdir(("d%02d" % i) * 85)
    chunk = b"x" * (1 << 20)
    try:
        for k in range({mb}):
            with open("f%d" % k, "wb") as f:
                f.write(chunk)
    except OSError:
        pass
    return x
"""
LEFTOVER_PROBE = """import os
def solve(x):
    mine = os.path.basename(__file__)
    left = [n for n in os.listdir("/work") if n != mine] + os.listdir("/tmp") + os.listdir("/dev/shm")
    return x * x if not left else -1
"""


@pytest.mark.parametrize("top,mb", [("/work", 300), ("/tmp", 200)], ids=["fill-work", "hold-tmp"])
def test_a_tree_deeper_than_path_max_does_not_outlive_its_docker_job(tmp_path, top, mb):
    """os.walk skips such a tree in silence: it kept /work full (the next honest job failed to be written) or
    held tmpfs memory against every later job. The wipe deletes through directory handles, and a container that
    still has leftovers is replaced."""
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    box = docker_sandbox_or_skip(workers=1)
    try:
        box.evaluate(problem, DEEP_HIDDEN.format(top=top, mb=mb))
        assert_vectors(box, problem, MIN_KNOWN)
        probe = box.evaluate(problem, LEFTOVER_PROBE)
        assert probe.scores == {"c0": 0.0, "c1": 0.0}, (probe.case_errors, probe.error)  # nothing left anywhere
    finally:
        box.close()
