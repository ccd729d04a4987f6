"""Docker-only containment: PID 1, tampering with the next job, the container killed or frozen from outside."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from evolve.problem import load_problem
from evolve.problem.outcome import ErrorKind
from sandboxes.docker_pool import OWNER
from tests.helpers import SPLIT_TOML, docker_sandbox_or_skip, reported, write_problem

pytestmark = pytest.mark.docker
TIMEOUT = 3.0


@pytest.fixture(scope="module")
def sandbox():
    box = docker_sandbox_or_skip(workers=1)
    yield box
    box.close()
    assert box.client.containers.list(all=True, filters={"label": f"vpo-evolve.owner={OWNER}"}) == []


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(write_problem(tmp_path_factory.mktemp("d"), timeout=TIMEOUT))


def _ok(sandbox, problem):
    outcome = sandbox.evaluate(problem, problem.seed_code)
    assert outcome.ok and outcome.scores == {"c0": 1.0, "c1": 1.0}, outcome.error


def _ours(sandbox):
    return sandbox.client.containers.list(filters={"label": f"vpo-evolve.owner={OWNER}"}, ignore_removed=True)


def test_killing_pid_1_is_refused(sandbox, problem):
    code = "import os, signal\ndef solve(x):\n    os.kill(1, signal.SIGKILL)\n    return x * x\n"
    outcome = sandbox.evaluate(problem, code)
    assert outcome.error_kind == ErrorKind.CRASH and "PermissionError" in outcome.error
    _ok(sandbox, problem)


def test_a_candidate_killed_by_a_real_time_signal_crashes_alone_in_the_same_container(sandbox, problem):
    """Signal 40 has no name in Python's enum: the runner used to fail on it, so the engine ran the candidate
    again in a fresh container (a second try on demand, two containers spent) before scoring a runner error."""
    _ok(sandbox, problem)
    (victim,) = _ours(sandbox)
    outcome = sandbox.evaluate(problem, "import os\ndef solve(x):\n    os.kill(os.getpid(), 40)\n")
    assert outcome.error_kind == ErrorKind.CRASH and "no reply (signal 40)" in outcome.error, outcome.error
    assert [c.id for c in _ours(sandbox)] == [victim.id]
    _ok(sandbox, problem)


@pytest.fixture
def readable_secret() -> Iterator[Path]:
    """A host file any uid may read (in a folder of its own under /tmp, 0755): only the mount view keeps it out."""
    folder = Path(tempfile.mkdtemp(prefix="evolve-host-secret-", dir="/tmp"))
    folder.chmod(0o755)
    secret = folder / "host-secret.txt"
    secret.write_text(f"hunter2-{uuid.uuid4().hex}")
    secret.chmod(0o644)
    yield secret
    shutil.rmtree(folder)


def test_host_files_are_not_visible(sandbox, problem, readable_secret):
    """The candidate prints what it read on stdout and stderr and returns it: the secret is in no field of the
    outcome, and the reported answer says the file is not there at all."""
    code = (
        "import sys\ndef solve(x):\n    try:\n"
        f"        text = open({str(readable_secret)!r}).read()\n"
        "    except OSError as exc:\n        text = type(exc).__name__\n"
        "    print(text)\n    print(text, file=sys.stderr)\n    return text\n"
    )
    outcome = sandbox.evaluate(problem, code)
    secret = readable_secret.read_text()
    fields = (outcome.feedback, outcome.stdout, outcome.stderr, outcome.error, repr(outcome.case_errors))
    assert not any(secret in (field or "") for field in fields), fields
    assert outcome.scores == {"c0": 0.0, "c1": 0.0}
    assert reported(outcome) == "FileNotFoundError" and "FileNotFoundError" in outcome.stdout, outcome.stdout
    _ok(sandbox, problem)


def test_a_child_that_outlives_its_job_cannot_tamper_with_the_next(sandbox, problem):
    code = (
        "import os, time, glob\ndef solve(x):\n    if os.fork() == 0:\n        os.setsid()\n"
        "        end = time.time() + 5\n        while time.time() < end:\n"
        "            for f in glob.glob('/work/*.py'):\n                try:\n"
        "                    open(f, 'w').write('def solve(x):\\n    return -1\\n')\n"
        "                except OSError:\n                    pass\n            time.sleep(0.001)\n"
        "        os._exit(0)\n    return x * x\n"
    )
    assert sandbox.evaluate(problem, code).ok
    for _ in range(3):
        _ok(sandbox, problem)


def test_container_killed_from_outside_mid_run(sandbox, problem):
    _ok(sandbox, problem)
    (victim,) = _ours(sandbox)
    threading.Timer(0.5, victim.kill).start()
    start = time.monotonic()
    outcome = sandbox.evaluate(problem, "def solve(x):\n    while True:\n        pass\n")
    assert not outcome.ok and time.monotonic() - start < TIMEOUT + 6
    _ok(sandbox, problem)
    assert victim.id not in [c.id for c in _ours(sandbox)]


def test_frozen_runner_is_abandoned_at_the_engine_deadline(sandbox, problem):
    _ok(sandbox, problem)
    (victim,) = _ours(sandbox)
    threading.Timer(0.3, victim.pause).start()
    start = time.monotonic()
    outcome = sandbox.evaluate(problem, "import time\ndef solve(x):\n    time.sleep(1)\n    return x * x\n")
    elapsed = time.monotonic() - start
    assert outcome.error_kind == ErrorKind.TIMEOUT and elapsed < TIMEOUT + 7
    _ok(sandbox, problem)
    assert victim.id not in [c.id for c in _ours(sandbox)]


def test_containers_keep_no_logs_and_are_locked_down(sandbox, problem):
    _ok(sandbox, problem)
    (box,) = _ours(sandbox)
    host = box.attrs["HostConfig"]
    assert host["LogConfig"]["Type"] == "none"
    assert host["NetworkMode"] == "none" and host["ReadonlyRootfs"] is True
    assert host["CapDrop"] == ["ALL"] and "no-new-privileges" in host["SecurityOpt"]
    assert host["Memory"] == host["MemorySwap"] > 0 and host["PidsLimit"] > 0


# Three processes of 200 MiB each: every one stays under RLIMIT_AS (memory_mb = 256), together they pass the
# container's memory cgroup (memory_mb + 256 MiB, no swap). Each child holds its block until every child has
# either allocated or died, so they overlap however slow the machine is. The cgroup's OOM killer takes one
# child; the parent carries on and answers correctly, so only the sandbox can tell that it ran out of memory.
SPREAD_HOG = """
import os, select, signal
KIDS = 3
HOGGED = []

def solve(x):
    if HOGGED:
        return x * x
    HOGGED.append(True)
    r, w = os.pipe()
    kids = []
    for _ in range(KIDS):
        pid = os.fork()
        if pid == 0:
            block = b'x' * (200 << 20)
            os.write(w, b'+')
            select.select([], [], [])  # hold the block until the parent is done
            os._exit(len(block) & 1)
        kids.append(pid)
    os.close(w)
    settled = 0
    while settled < KIDS:
        if select.select([r], [], [], 0.05)[0]:
            settled += len(os.read(r, KIDS))
        while settled < KIDS:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            settled += 1
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass
    return x * x
"""


def test_memory_spread_over_processes_meets_the_cgroup_cap_and_scores_memory(sandbox, tmp_path):
    toml = SPLIT_TOML.format(name="m", timeout=10.0).replace("memory_mb = 512", "memory_mb = 256")
    small = load_problem(write_problem(tmp_path / "m", toml=toml))
    _ok(sandbox, small)
    (box,) = _ours(sandbox)
    host = box.attrs["HostConfig"]
    assert host["Memory"] == host["MemorySwap"] == (256 + 256) << 20
    one_child = sandbox.evaluate(small, SPREAD_HOG.replace("KIDS = 3", "KIDS = 1"))
    assert one_child.scores == {"c0": 1.0, "c1": 1.0}, one_child.error  # under the cap: no false alarm
    outcome = sandbox.evaluate(small, SPREAD_HOG)
    assert outcome.error_kind == ErrorKind.MEMORY, (outcome.error, outcome.scores)
    assert outcome.scores == {"c0": 0.0, "c1": 0.0} and "memory cgroup" in outcome.error
    for code, want in (("def solve(x):\n    return 9\n", {"c0": 0.0, "c1": 1.0}), (GOOD, {"c0": 1.0, "c1": 1.0})):
        assert sandbox.evaluate(small, code).scores == want


def test_spawn_mode_scores_like_fork_mode(problem):
    box = docker_sandbox_or_skip(workers=1, spawn=True)
    try:
        _ok(box, problem)
        outcome = box.evaluate(problem, "def solve(x):\n    return len(bytearray(10 * 1024**3))\n")
        assert outcome.error_kind == ErrorKind.MEMORY
        _ok(box, problem)
    finally:
        box.close()


def test_auto_picks_docker_and_says_so(sandbox, tmp_path, problem):
    import json
    import subprocess
    import sys

    prog = tmp_path / "cand.py"
    prog.write_text("def solve(x):\n    return x * x\n")
    out = subprocess.run(
        [sys.executable, "-m", "evolve.cli", "eval", str(problem.root), str(prog), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    data = json.loads(out.stdout)
    assert data["sandbox"] == "docker" and data["scores"] == {"c0": 1.0, "c1": 1.0}
    assert "docker sandbox" in data["isolation"]


FORGE = (
    "import os\nfor pid in os.listdir('/proc'):\n    try:\n"
    "        if b'container_runner' not in open(f'/proc/{pid}/cmdline', 'rb').read():\n            continue\n"
    "        for fd in os.listdir(f'/proc/{pid}/fd'):\n            if fd != '0':\n                try:\n"
    "                    with open(f'/proc/{pid}/fd/{fd}', 'w') as f:\n"
    '                        f.write(\'{"reply": null, "status": "exit 0", "nonce": "guess"}\\n\')\n'
    "                except OSError:\n                    pass\n    except OSError:\n        pass\n"
)


def _forge_on_every_channel(sandbox, stop: threading.Event, once: bool) -> None:
    """Write a line on the runner's channel from outside the candidate, as a leaked descriptor would."""
    while not stop.is_set():
        for box in _ours(sandbox):
            with contextlib.suppress(Exception):  # the container may be being replaced
                box.exec_run([sandbox.image_spec.python, "-I", "-c", FORGE])
        if once:
            return
        time.sleep(0.1)


def test_a_stray_line_on_the_channel_reruns_the_job_in_a_fresh_container(sandbox, problem):
    """The engine takes only the line carrying its job's nonce; anything else costs the container, not the score.

    The stray line is written while the container is idle, so it surely comes before the job's answer on the
    channel (one pipe: first written, first read): an engine that took any answer-shaped line would score it."""
    _ok(sandbox, problem)
    (victim,) = _ours(sandbox)
    _forge_on_every_channel(sandbox, threading.Event(), True)
    outcome = sandbox.evaluate(problem, GOOD)
    assert outcome.scores == {"c0": 1.0, "c1": 1.0}, outcome.error
    assert victim.id not in [c.id for c in _ours(sandbox)]
    for code, want in (("def solve(x):\n    return 4\n", {"c0": 1.0, "c1": 0.0}), (GOOD, {"c0": 1.0, "c1": 1.0})):
        assert sandbox.evaluate(problem, code).scores == want


def test_stray_lines_twice_make_the_answer_bad_output(sandbox, problem):
    _ok(sandbox, problem)
    stop = threading.Event()
    _forge_on_every_channel(sandbox, stop, True)  # before the job's answer; the thread forges in the next container
    forger = threading.Thread(target=_forge_on_every_channel, args=(sandbox, stop, False))
    forger.start()
    try:
        outcome = sandbox.evaluate(problem, "import time\ndef solve(x):\n    time.sleep(1.5)\n    return x * x\n")
    finally:
        stop.set()
        forger.join()
    assert outcome.error_kind == ErrorKind.BAD_OUTPUT and "twice" in outcome.error
    assert outcome.scores == {"c0": 0.0, "c1": 0.0}
    for code, want in (("def solve(x):\n    return 9\n", {"c0": 0.0, "c1": 1.0}), (GOOD, {"c0": 1.0, "c1": 1.0})):
        assert sandbox.evaluate(problem, code).scores == want


GOOD = "def solve(x):\n    return x * x\n"
