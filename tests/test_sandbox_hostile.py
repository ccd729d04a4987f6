"""Hostile candidates against every sandbox backend: each is contained, and the next evaluations are right.

After every hostile case, programs with distinct known vectors are scored (`assert_known_vectors`): a reply
shifted to the next job, or a stale one, gives one of them another's vector.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from evolve.problem import load_problem
from evolve.problem.outcome import ErrorKind
from sandboxes.process import ProcessSandbox
from sandboxes.seccomp import SocketRule
from tests.helpers import assert_known_vectors, docker_sandbox_or_skip, write_problem
from tests.services import missing

TIMEOUT = 2.0


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(write_problem(tmp_path_factory.mktemp("p"), timeout=TIMEOUT))


@pytest.fixture(scope="module", params=["process", "docker"])
def sandbox(request):
    box = ProcessSandbox(slots=2) if request.param == "process" else docker_sandbox_or_skip(workers=1)
    yield box
    box.close()


def _procs_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _procs_named(name: str) -> list[int]:
    """Live processes whose name (/proc/PID/comm, which a candidate sets with prctl) is `name`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and _uid(entry) is not None:
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _assert_next_is_correct(sandbox, problem):
    assert_known_vectors(sandbox, problem)


def test_seed_scores_and_isolation_is_reported(sandbox, problem):
    outcome = sandbox.evaluate(problem, problem.seed_code)
    assert outcome.ok and outcome.scores == {"c0": 1.0, "c1": 1.0}, outcome.error
    assert f"{sandbox.kind} sandbox" in sandbox.isolation()


def _run(sandbox, problem, code):
    start = time.monotonic()
    outcome = sandbox.evaluate(problem, code)
    return outcome, time.monotonic() - start


def test_infinite_loop_is_killed_at_the_deadline(sandbox, problem):
    outcome, elapsed = _run(sandbox, problem, "def solve(x):\n    while True:\n        pass\n")
    assert outcome.error_kind == ErrorKind.TIMEOUT
    assert outcome.scores == {"c0": 0.0, "c1": 0.0}
    assert elapsed < TIMEOUT + 2
    _assert_next_is_correct(sandbox, problem)


def test_fork_bomb_is_contained(sandbox, problem):
    if sandbox.kind == "process":
        assert os.geteuid() != 0 or sandbox.drop_uid, sandbox.isolation()
    # Every process of the bomb carries its name (set before the first fork, inherited by each): whatever uid
    # it runs as, and whichever slot or container ran it, a survivor is found by it.
    name = f"bomb-{uuid.uuid4().hex[:8]}"
    code = (
        "import ctypes, os, time\ndef solve(x):\n"
        f"    ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\n"
        "    for _ in range(100000):\n        try:\n            os.fork()\n"
        "        except OSError:\n            time.sleep(0.01)\n    return 0\n"
    )
    _assert_next_is_correct(sandbox, problem)  # a warm sandbox: a container's start is not the bomb's time
    outcome, elapsed = _run(sandbox, problem, code)
    assert not outcome.ok
    # the deadline, then the sweep of every process the bomb made (it races the kills for a while)
    assert elapsed < TIMEOUT + 3
    uids = set(sandbox.slot_uids) if sandbox.kind == "process" else set()  # every slot, not only the first two
    deadline = time.monotonic() + 3  # the sweep may still be reaping the last of them on a loaded machine
    while True:
        time.sleep(0.1)
        leftover = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _uid(p) in uids]
        leftover += _procs_named(name)
        if not leftover or time.monotonic() > deadline:
            break
    assert leftover == []
    _assert_next_is_correct(sandbox, problem)


def _uid(path: Path) -> int | None:
    """The uid of a live (non-zombie) process."""
    try:
        if (path / "stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX":
            return None
        return path.stat().st_uid
    except OSError:
        return None


def test_huge_allocation_is_a_memory_error(sandbox, problem):
    outcome, elapsed = _run(sandbox, problem, "def solve(x):\n    return len(bytearray(10 * 1024**3))\n")
    assert outcome.error_kind == ErrorKind.MEMORY
    assert elapsed < TIMEOUT + 2
    _assert_next_is_correct(sandbox, problem)


def test_flood_of_stdout_is_capped(sandbox, problem):
    code = (
        "import sys\ndef solve(x):\n    s = 'x' * (1 << 20)\n    for _ in range(1024):\n"
        "        sys.stdout.write(s)\n    return x * x\n"
    )
    outcome, elapsed = _run(sandbox, problem, code)
    assert len(outcome.stdout) <= 64 * 1024
    assert elapsed < TIMEOUT + 2
    _assert_next_is_correct(sandbox, problem)


def test_writes_outside_the_work_dir_fail(sandbox, problem, tmp_path):
    """The host's folders are out of reach, and system paths (bind-mounted read-only in Docker) are not writable."""
    target = tmp_path / "escaped.txt"
    code = (
        "def solve(x):\n    out = []\n"
        f"    for path in ({str(target)!r}, '/usr/lib/evolve-escaped.txt'):\n"
        "        try:\n            open(path, 'w').write('x')\n            out.append('written')\n"
        "        except OSError as e:\n            out.append(type(e).__name__)\n    return out\n"
    )
    outcome, _ = _run(sandbox, problem, code)
    assert not target.exists() and not Path("/usr/lib/evolve-escaped.txt").exists()
    assert "written" not in (outcome.feedback or ""), outcome.feedback
    _assert_next_is_correct(sandbox, problem)


def test_orphaned_background_child_is_killed(sandbox, problem):
    marker = "orphan-marker-31337"
    code = (
        "import subprocess, sys\ndef solve(x):\n    subprocess.Popen([sys.executable, '-c',"
        f" 'import time; time.sleep(60)', '{marker}'], start_new_session=True)\n    return x * x\n"
    )
    outcome, _ = _run(sandbox, problem, code)
    assert outcome.ok
    time.sleep(0.2)
    assert _procs_with(marker) == []
    _assert_next_is_correct(sandbox, problem)


def test_network_is_unreachable(sandbox, problem):
    """No interface but loopback, no route, and the host's loopback services are out of reach.

    Nothing here sends a packet to any address beyond the machine: the sandbox has nowhere to send it.
    """
    if sandbox.kind == "process" and not sandbox.network_isolated:
        missing("network namespaces", f"the kernel refuses them here; the sandbox says so: {sandbox.isolation()}")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(3)
    port = server.getsockname()[1]
    got: list[object] = []
    threading.Thread(target=lambda: got.append(_accept(server)), daemon=True).start()
    code = (
        "import socket\ndef solve(x):\n    try:\n        names = sorted(n for _, n in socket.if_nameindex())\n"
        "    except PermissionError:  # the process sandbox refuses sockets its memory bound cannot count\n"
        "        names = 'refused'\n"
        "    routes = open('/proc/net/route').read().splitlines()[1:]\n    try:\n"
        f"        socket.create_connection(('127.0.0.1', {port}), timeout=1)\n        reach = 'connected'\n"
        "    except OSError:\n        reach = 'blocked'\n    return [names, routes, reach]\n"
    )
    outcome, _ = _run(sandbox, problem, code)
    names = "['lo']" if getattr(sandbox, "sockets", SocketRule.ALL) is SocketRule.ALL else "'refused'"
    assert f"[{names}, [], 'blocked']" in (outcome.feedback or ""), outcome.feedback
    time.sleep(0.5)
    assert got in ([], [None])
    server.close()
    _assert_next_is_correct(sandbox, problem)


def _accept(server: socket.socket) -> object:
    try:
        return server.accept()
    except OSError:
        return None


def test_environment_is_scrubbed(sandbox, problem, monkeypatch):
    """A secret in the engine's own environment (first and last, where a copy of it would put it) is not in
    the candidate's. The candidate searches itself and answers in numbers: c0 right means no secret found,
    c1 right means it did see an environment (HOME), so {1, 1} exactly is a search that ran and found nothing."""
    secret = f"sk-{uuid.uuid4().hex}"
    environ = dict(os.environ)  # put back in order below, between the two secrets (all restored at the end)
    for key in list(environ):
        monkeypatch.delenv(key)
    monkeypatch.setenv("AAA_OPENAI_API_KEY", secret)
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("ZZZ_EVOLVE_SECRET", secret)
    names = list(os.environ)
    assert names[0] == "AAA_OPENAI_API_KEY" and names[-1] == "ZZZ_EVOLVE_SECRET"
    half = len(secret) // 2
    code = (
        "import os\ndef solve(x):\n"
        f"    secret = {secret[:half]!r} + {secret[half:]!r}\n"
        "    found = any(secret in k or secret in v or 'OPENAI' in k or 'EVOLVE_SECRET' in k"
        " for k, v in os.environ.items())\n"
        "    if x == 2:\n        return -1 if found else 4\n"
        "    return 9 if os.environ.get('HOME') else -1\n"
    )
    outcome, _ = _run(sandbox, problem, code)
    assert outcome.scores == {"c0": 1.0, "c1": 1.0}, (outcome.error, outcome.feedback)
    _assert_next_is_correct(sandbox, problem)


def test_garbage_on_the_reply_pipe_is_bad_output(sandbox, problem):
    code = (
        "import os\ndef solve(x):\n    for fd in range(3, 4096):\n        try:\n"
        "            os.write(fd, b'not json')\n        except OSError:\n            pass\n"
        "    os._exit(0)\n"
    )
    outcome, _ = _run(sandbox, problem, code)
    assert outcome.error_kind == ErrorKind.BAD_OUTPUT, outcome.error
    assert outcome.scores == {"c0": 0.0, "c1": 0.0}
    _assert_next_is_correct(sandbox, problem)


def test_hard_exit_without_reply_is_a_crash(sandbox, problem):
    outcome, _ = _run(sandbox, problem, "import os\ndef solve(x):\n    os._exit(3)\n")
    assert outcome.error_kind == ErrorKind.CRASH
    assert "exit 3" in outcome.error
    _assert_next_is_correct(sandbox, problem)


def test_missing_entry_point_is_invalid(sandbox, problem):
    outcome, _ = _run(sandbox, problem, "def other(x):\n    return 1\n")
    assert outcome.error_kind == ErrorKind.INVALID
    _assert_next_is_correct(sandbox, problem)
