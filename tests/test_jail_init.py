"""The jail's first process and the end of a job (sandboxes/jail_init.py, sandboxes/jail_watch.py), attacked.

A red team, with the engine unprivileged, wrote bubblewrap's init through /proc/1/mem (same uid, dumpable), made
it report a clean exit and kept the job's pid namespace alive after the engine: 13 CPU burners later, the next
honest program timed out. Each test here scores known programs afterwards and asserts their exact vectors.
The unprivileged pass (scripts/test-as-user.sh) runs this file too: the init's reach matters most there.
"""

from __future__ import annotations

import errno
import os
import time
import uuid

import pytest

from evolve.problem import load_problem
from evolve.problem.outcome import ErrorKind
from sandboxes import jail as jail_module
from sandboxes.jail import SCRATCH_INODES, WORK
from tests.helpers import assert_known_vectors, hiding_sandbox, reported, write_problem


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(write_problem(tmp_path_factory.mktemp("init attacked"), timeout=4.0))


@pytest.fixture(scope="module")
def jailed():
    box = hiding_sandbox("process", slots=1)
    yield box
    box.close()


REACH_INIT = """
import os, signal
def solve(x):
    got = {"me": (os.getpid(), os.getppid()), "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}
    for name, path, mode in (("mem rw", "/proc/1/mem", os.O_RDWR), ("mem r", "/proc/1/mem", os.O_RDONLY),
                             ("environ", "/proc/1/environ", os.O_RDONLY), ("stdout", "/proc/1/fd/1", os.O_WRONLY)):
        try:
            os.close(os.open(path, mode))
            got[name] = "opened"
        except OSError as e:
            got[name] = e.errno
    try:
        got["fds"] = os.listdir("/proc/1/fd")
    except OSError as e:
        got["fds"] = e.errno
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGSTOP, signal.SIGKILL):
        try:  # refused as another uid (root's engine), else dropped: the namespace's init has no handler for them
            os.kill(1, number)
        except PermissionError:
            pass
    return got
"""


def test_the_candidate_can_reach_no_process_but_itself_and_its_own(jailed, problem):
    """The jail holds the init (pid 1) and the harness (pid 2, the candidate itself) and nothing else; the init's
    memory, environment and descriptors cannot be opened, and its signals do not stop or kill it (the job goes on
    to reply, which a stopped or dead init would prevent)."""
    got = reported(jailed.evaluate(problem, REACH_INIT))
    assert got["me"] == [2, 1] and got["procs"] == [1, 2], got
    refused = (errno.EACCES, errno.EPERM)
    assert all(got[k] in refused for k in ("mem rw", "mem r", "environ", "stdout", "fds")), got
    assert_known_vectors(jailed, problem)


def _processes_with(marker: bytes) -> list[int]:
    """Host pids whose command line holds `marker` (each process of a job forked from the lingering init does)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"{entry.path}/cmdline", "rb") as f:
                    if marker in f.read():
                        found.append(int(entry.name))
            except OSError:
                continue
    return [p for p in found if p != os.getpid()]


def test_a_job_whose_init_was_taken_over_ends_with_everything_it_started(jailed, problem, monkeypatch):
    """The init is assumed taken over: it drops the sweep's token from its environment, clears its parent-death
    signal, starts CPU burners in new sessions, lets the harness answer, and never exits. The engine ends the job
    at its deadline by SIGKILLing the namespace's init through its own pidfd (not through bubblewrap, nor the
    init's goodwill): nothing of it is left. (As root the slot's memory cgroup would also kill them.)"""
    marker = f"lingering-init-{uuid.uuid4().hex}"
    taken_over = f"""# {marker}
import ctypes, os, sys, time
if "EVOLVE_SANDBOX_TOKEN" in os.environ:  # the token the engine's sweep looks for, blanked
    del os.environ["EVOLVE_SANDBOX_TOKEN"]
    os.execv(sys.executable, open("/proc/self/cmdline", "rb").read().split(b"\\0")[:-1])
ctypes.CDLL(None).prctl(1, 0, 0, 0, 0)  # no parent-death signal
for _ in range(3):
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
keep = int(sys.argv[2])
harness = sys.argv[sys.argv.index("--") + 1:]
if os.fork() == 0:
    os.set_inheritable(keep, True)
    os.execv(harness[0], harness)
while True:
    time.sleep(1)
"""
    with monkeypatch.context() as patched:
        patched.setattr(jail_module, "INIT_SOURCE", taken_over)
        started = time.monotonic()
        outcome = jailed.evaluate(problem, KNOWN_SQUARE)
        took = time.monotonic() - started
    left = _processes_with(marker.encode())
    assert left == [], f"{len(left)} processes of the job outlived it"
    assert outcome.error_kind == ErrorKind.TIMEOUT and took < problem.config.sandbox_limits.timeout_s + 8, (
        outcome.error_kind,
        took,
    )
    assert_known_vectors(jailed, problem)


KNOWN_SQUARE = "def solve(x):\n    return x * x\n"

FILL_INODES = """
import os
def solve(x):
    got = {}
    for folder in ("/tmp", "/dev/shm", WORK):
        made, error = 0, None
        while made < 3 * TMP_INODES:
            try:
                os.close(os.open(f"{folder}/f{made}", os.O_CREAT | os.O_WRONLY, 0o600))
            except OSError as e:
                error = e.errno
                break
            made += 1
        got[folder] = (made, error)
        for i in range(made):
            os.unlink(f"{folder}/f{i}")
    return got
"""


def test_empty_files_stop_at_each_scratch_mounts_inode_limit(either, problem):
    """Without a memory cgroup, 742,000 empty files held 1.1 GB of kernel memory (inodes and dentries, which neither
    the tmpfs size nor RLIMIT_AS counts). Each scratch mount now runs out of inodes (ENOSPC) at its limit, in the
    jail and in Docker (where the container's memory cgroup bounds them too, but only at the job's timeout)."""
    code = FILL_INODES.replace("TMP_INODES", str(SCRATCH_INODES["/tmp"])).replace("WORK", repr(WORK))
    got = reported(either.evaluate(problem, code))
    for folder, inodes in SCRATCH_INODES.items():
        made, error = got[folder]
        assert error == errno.ENOSPC and inodes - 64 <= made < inodes, (folder, made, error)
    assert_known_vectors(either, problem)


@pytest.fixture(scope="module", params=["process", "docker"])
def either(request):
    box = hiding_sandbox(request.param, slots=1)
    yield box
    box.close()


@pytest.mark.parametrize(
    ("ending", "kind", "said"),
    [
        ("os._exit(137)", ErrorKind.CRASH, "exit 137"),
        ("os._exit(152)", ErrorKind.CRASH, "exit 152"),
        ("os.kill(os.getpid(), signal.SIGKILL)", ErrorKind.CRASH, "signal SIGKILL"),
        ("os.kill(os.getpid(), signal.SIGXCPU)", ErrorKind.CRASH, "signal SIGXCPU"),
    ],
)
def test_an_ending_that_looks_like_a_limit_is_a_crash_unless_the_limit_was_reached(either, problem, ending, kind, said):
    """bubblewrap folds a death by signal N into exit code 128+N, and a death by SIGKILL was taken for memory and
    one by SIGXCPU for a timeout: a candidate that exited with 137 or 152, or killed itself, was stored as
    `memory` or `timeout`. The init's report and the CPU it saw spent decide now."""
    outcome = either.evaluate(problem, f"import os, signal\ndef solve(x):\n    {ending}\n")
    assert (outcome.error_kind, said in (outcome.error or "")) == (kind, True), (outcome.error_kind, outcome.error)
    assert_known_vectors(either, problem)
