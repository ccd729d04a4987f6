"""Hostile candidates against every sandbox backend: each is contained, and the next evaluation is right."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from evolve.problem import load_problem
from sandboxes.base import ErrorKind
from sandboxes.process import ProcessSandbox
from sandboxes.seccomp import SocketRule
from tests.helpers import docker_sandbox_or_skip, write_problem

TIMEOUT = 2.0


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(write_problem(tmp_path_factory.mktemp("p"), timeout=TIMEOUT))


@pytest.fixture(scope="module", params=["process", "docker"])
def sandbox(request):
    if request.param == "process":
        yield ProcessSandbox(slots=2)
        return
    box = docker_sandbox_or_skip(workers=1)
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


def _assert_next_is_correct(sandbox, problem):
    outcome = sandbox.evaluate(problem, problem.seed_code)
    assert outcome.ok, outcome.error
    assert outcome.scores == {"c0": 1.0, "c1": 1.0}


def test_seed_scores_and_isolation_is_reported(sandbox, problem):
    _assert_next_is_correct(sandbox, problem)
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
    code = (
        "import os, time\ndef solve(x):\n    for _ in range(100000):\n        try:\n            os.fork()\n"
        "        except OSError:\n            time.sleep(0.01)\n    return 0\n"
    )
    _assert_next_is_correct(sandbox, problem)  # a warm sandbox: a container's start is not the bomb's time
    outcome, elapsed = _run(sandbox, problem, code)
    assert not outcome.ok
    # the deadline, then the sweep of every process the bomb made (it races the kills for a while)
    assert elapsed < TIMEOUT + 3
    uids = {61000, 61001} if sandbox.kind == "process" else {1000}
    deadline = time.monotonic() + 3  # the sweep may still be reaping the last of them on a loaded machine
    while True:
        time.sleep(0.1)
        leftover = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _uid(p) in uids]
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
        pytest.skip("kernel refuses network namespaces here; isolation() says so")
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
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value")
    outcome, _ = _run(sandbox, problem, "import os\ndef solve(x):\n    return dict(os.environ)\n")
    assert "sk-secret-value" not in (outcome.feedback or "")
    assert "HOME" in (outcome.feedback or "")


def test_garbage_on_the_reply_pipe_is_bad_output(sandbox, problem):
    code = (
        "import os\ndef solve(x):\n    for fd in range(3, 64):\n        try:\n"
        "            os.write(fd, b'not json')\n        except OSError:\n            pass\n"
        "    os._exit(0)\n"
    )
    outcome, _ = _run(sandbox, problem, code)
    assert outcome.error_kind in (ErrorKind.BAD_OUTPUT, ErrorKind.CRASH)
    _assert_next_is_correct(sandbox, problem)


def test_hard_exit_without_reply_is_a_crash(sandbox, problem):
    outcome, _ = _run(sandbox, problem, "import os\ndef solve(x):\n    os._exit(3)\n")
    assert outcome.error_kind == ErrorKind.CRASH
    assert "exit 3" in outcome.error


def test_missing_entry_point_is_invalid(sandbox, problem):
    outcome, _ = _run(sandbox, problem, "def other(x):\n    return 1\n")
    assert outcome.error_kind == ErrorKind.INVALID
