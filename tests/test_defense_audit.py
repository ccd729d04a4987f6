"""Defenses a mutation audit found untested, or tested only where root does not run: each test here failed with its
defense disabled and passes with it.

- the split-form evaluator never enters the job's folder (a cheat doing `import evaluate` once scored 1.0);
- the sweep kills a job's leftovers that left its session, by the slot's uid and by the job's token;
- the job's memory cgroup is killed whole when the job ends, whatever the sweep and the pid namespace can see.

CI runs this file as root and, through scripts/test-as-user.sh, as an unprivileged user.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from evolve.problem import load_problem
from evolve.problem.outcome import ErrorKind
from sandboxes.jail import find_jail
from sandboxes.process import ProcessSandbox
from sandboxes.sweep import kill_all
from tests.helpers import assert_known_vectors, hiding_sandbox, weak_sandbox_or_skip, write_problem
from tests.services import missing

# Looks for the problem's evaluator everywhere a job's files could be (its own folder, the import path, the
# scratch folders), by import and by reading, and answers from its table of expected outputs; -1 otherwise,
# which is what an honest wrong answer scores.
EVALUATOR_HUNT = """import glob, importlib, os, sys
def _table(cases):
    return {repr(c["input"]): c["expected"] for c in cases()}
def _found():
    for name in ("evaluate", "_evolve_evaluator"):
        try:
            return _table(importlib.import_module(name).cases)
        except Exception:
            pass
    me = os.path.abspath(__file__)
    folders = {os.getcwd(), os.path.dirname(me), "/work", "/tmp", "/data", *(p for p in sys.path if p)}
    for folder in folders:
        for path in glob.glob(os.path.join(folder, "*.py")) + glob.glob(os.path.join(folder, "*", "*.py")):
            try:
                text = open(path, errors="replace").read()
            except OSError:
                continue
            if path != me and "def cases" in text:
                namespace = {}
                try:
                    exec(compile(text, path, "exec"), namespace)
                    return _table(namespace["cases"])
                except Exception:
                    pass
    return {}
def solve(x):
    return _found().get(repr(x), -1)
"""


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(write_problem(tmp_path_factory.mktemp("audit") / "p"))


@pytest.mark.parametrize("kind", ["process", "docker"])
def test_a_split_form_evaluator_is_nowhere_in_the_job(kind, problem):
    box = hiding_sandbox(kind, 1)
    try:
        outcome = box.evaluate(problem, EVALUATOR_HUNT)
        assert outcome.error is None and outcome.scores == {"c0": 0.0, "c1": 0.0}, (outcome.error, outcome.feedback)
        assert_known_vectors(box, problem)
    finally:
        box.close()


def _live(pids: list[int]) -> list[int]:
    """Those of `pids` still running (a zombie has ended: its parent merely has not reaped it yet)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    alive.append(pid)
        except OSError:
            pass
    return alive


def _pids_of_uid(uid: int) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                found.append(int(entry.name))
        except OSError:
            pass
    return _live(found)


def _pids_with(marker: bytes) -> list[int]:
    """Processes whose command line holds `marker` (the sweep's token goes in their environment instead)."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and marker in Path(entry.path, "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return _live(found)


def _free_uid() -> int:
    """A uid no process runs as, clear of the process sandbox's slot uids (61000 + 1024)."""
    for uid in range(59000, 59100):
        if not _pids_of_uid(uid):
            return uid
    raise AssertionError("no free uid in 59000..59099")


# A leader that leaves an orphan in a session of its own (out of the leader's process group) and then waits.
LEAVER = "setsid sleep {marker} & sleep {marker}"


@pytest.fixture(params=["uid", "token"] if os.geteuid() == 0 else ["token"])
def sweep_by(request) -> str:
    """What the sweep finds a job's processes by: the slot's uid (only root hands out uids, so there is no such
    case without root) or the token in their environment."""
    return request.param


def _marker() -> str:
    """A sleep of a minute that no other process has on its command line."""
    return f"60.{secrets.randbelow(10**12):012d}"


def _outside_session(marker: str, session: int) -> list[int]:
    """The processes holding `marker` that left the session (the shell holds it too, and so does its fork until
    it has called setsid)."""
    found = []
    for pid in _pids_with(marker.encode()):
        try:
            if os.getsid(pid) != session:
                found.append(pid)
        except OSError:
            pass
    return found


def test_the_sweep_kills_an_orphan_that_left_the_jobs_session(sweep_by):
    """The process group's SIGKILL misses an orphan in another session: the sweep finds it by uid or token."""
    marker = _marker()
    token = secrets.token_hex(12)
    uid = _free_uid() if sweep_by == "uid" else None
    env = {"PATH": os.environ["PATH"], "EVOLVE_SANDBOX_TOKEN": token}
    leader = subprocess.Popen(
        ["/bin/sh", "-c", LEAVER.format(marker=marker)], env=env, start_new_session=True, user=uid, group=uid
    )
    try:
        deadline = time.monotonic() + 10
        while not _outside_session(marker, leader.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _outside_session(marker, leader.pid), "the orphan never left the session"
        kill_all(leader.pid, uid, None if uid is not None else token.encode())
        leader.wait(timeout=10)
        time.sleep(0.05)  # a killed orphan is reaped by init (or by us, where we are its subreaper)
        assert _pids_with(marker.encode()) == []
        if uid is not None:
            assert _pids_of_uid(uid) == []
    finally:
        for pid in _pids_with(marker.encode()):
            os.kill(pid, signal.SIGKILL)
        leader.kill()
        leader.wait()


@pytest.fixture(scope="module", params=["jail", "weak"])
def box(request) -> Iterator[ProcessSandbox]:
    sandbox = weak_sandbox_or_skip(slots=1) if request.param == "weak" else hiding_sandbox("process", slots=1)
    yield sandbox
    sandbox.close()


ORPHAN = """import os, sys, time
def solve(x):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sleep", ["sleep", MARKER])
        os._exit(0)
    os.wait()
    return x * x
"""


def test_a_job_leaves_no_process_behind(box, problem):
    """An orphan in a session of its own, double-forked: once evaluate() returns, no process of the job is left,
    by its command line and (as root) by the slot's uid."""
    marker = _marker()
    outcome = box.evaluate(problem, ORPHAN.replace("MARKER", repr(marker)))
    assert outcome.scores == {"c0": 1.0, "c1": 1.0}, outcome.error
    assert _pids_with(marker.encode()) == []
    assert [p for uid in box.slot_uids for p in _pids_of_uid(uid)] == []
    assert_known_vectors(box, problem)


def test_whatever_is_in_the_jobs_cgroup_when_it_ends_is_killed(problem):
    """The job's memory cgroup is killed whole as the job ends, beside the sweep and the pid namespace: a process
    that neither finds (another uid, no token, outside the jail's namespaces) is put into the cgroup while the job
    runs, and must be dead once evaluate() returns. (Removing that kill from the sandbox passed every other test.)"""
    if find_jail()[0] is None:
        missing("bubblewrap", find_jail()[1])
    box = ProcessSandbox(slots=1)
    if not box.bounds_job_memory:
        box.close()
        if os.geteuid() == 0:  # root on Linux with a memory hierarchy mounted: a cgroup must be made
            from sandboxes.cgroups import find_parent

            missing("memory cgroup", find_parent()[2])
        pytest.skip("no memory cgroup without root or a delegated cgroup v2: no cgroup kill to test here")
    (cgroup,) = box.cgroup_paths
    stray = subprocess.Popen(["/bin/sleep", "60"], start_new_session=True)
    try:
        job = threading.Thread(
            target=lambda: box.evaluate(problem, "import time\ndef solve(x):\n    time.sleep(0.4)\n")
        )
        job.start()
        deadline = time.monotonic() + 30
        while not (cgroup / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.005)
        (cgroup / "cgroup.procs").write_text(str(stray.pid))  # after the job's start, which empties the cgroup
        job.join()
        assert stray.wait(timeout=5) == -signal.SIGKILL
        assert_known_vectors(box, problem)
    finally:
        stray.kill()
        stray.wait()
        box.close()


PASS_THROUGH_EVAL = """
def cases():
    return [{"name": "c0", "input": 2, "expected": 4}, {"name": "c1", "input": 3, "expected": 9}]

def score(case, output):
    return float(output)  # an evaluator that passes the candidate's own number through, unclamped
"""


def test_finite_scores_whose_scalar_overflows_are_invalid(tmp_path):
    """Two components of 1e308 are each finite, but their weighted sum is not: stored, that infinite scalar was the
    run's best for ever (a red team's). Such a result is `invalid` now; large finite results still count."""
    problem = load_problem(write_problem(tmp_path / "pass-through", evaluate=PASS_THROUGH_EVAL))
    box = hiding_sandbox("process", slots=1)
    try:
        for value in ("1e308", "-1e308"):
            outcome = box.evaluate(problem, f"def solve(x):\n    return {value}\n")
            assert outcome.error_kind == ErrorKind.INVALID, (value, outcome.error_kind, outcome.scores)
            assert "scalar view is not finite" in (outcome.error or ""), outcome.error
        fine = box.evaluate(problem, "def solve(x):\n    return 1e300\n")
        assert (fine.error_kind, fine.scores) == (None, {"c0": 1e300, "c1": 1e300})
    finally:
        box.close()
