"""Hostile compiled candidates and hostile builds, in both sandboxes: each is contained, its build fails as kind
`build` with its log, and the known C programs scored right after it get exactly their own vectors.

The test problem's build runs the compiled candidate once (`./prog --build`, as a build script or code
generator would), so each hostile build here is a C program: one that loops, one that fills the scratch disk,
one that reaches for the host's network, and one that has the compiler read a host file into its log.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from evolve.problem import load_problem
from evolve.problem.outcome import ErrorKind
from sandboxes.jail import find_jail
from sandboxes.process import ProcessSandbox
from tests.helpers import docker_sandbox_or_skip
from tests.native import assert_known_c_vectors, c_program, write_c_problem
from tests.services import missing

BUILD_TIMEOUT = 2.0
FILL_BUILD_TIMEOUT = 20.0
FAILED = {"c0": 0.0, "c1": 0.0}

NETWORK_HEAD = "#include <arpa/inet.h>\n#include <sys/socket.h>\n"
CONNECT = (
    'int s = socket(AF_INET, SOCK_STREAM, 0); if (s < 0) {{ perror("socket"); return 1; }}'
    " struct sockaddr_in a = {{0}}; a.sin_family = AF_INET; a.sin_port = htons({port});"
    ' a.sin_addr.s_addr = inet_addr("127.0.0.1");'
    ' if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {{ perror("connect"); return 1; }}'
    ' puts("connected");'
)
# Files of 15 MiB (under the build's 16 MiB file limit) until the 256 MiB scratch is full.
FILL = (
    "static char block[1 << 16]; memset(block, 'x', sizeof block);"
    ' for (int i = 0; ; i++) { char name[32]; sprintf(name, "fill%d", i); FILE *f = fopen(name, "w");'
    ' if (!f) { perror("fopen"); return 1; }'
    " for (int j = 0; j < 240; j++)"
    ' if (fwrite(block, 1, sizeof block, f) != sizeof block) { perror("fwrite"); return 1; }'
    ' if (fclose(f) != 0) { perror("fclose"); return 1; } }'
)


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(write_c_problem(tmp_path_factory.mktemp("c"), build_timeout=BUILD_TIMEOUT))


@pytest.fixture(scope="module", params=["process", "docker"])
def sandbox(request):
    if request.param == "process":
        jail, why = find_jail()
        if jail is None:  # without it a build's files land on the host's disk, and host files are readable
            missing("bubblewrap", why)
        box = ProcessSandbox(slots=2)
    else:
        box = docker_sandbox_or_skip(workers=1)
    assert box.hides_files, box.isolation()
    yield box
    box.close()


def _accept(server: socket.socket, got: list[object]) -> None:
    with contextlib.suppress(OSError):  # the timeout: nobody came
        got.append(server.accept())


def test_a_case_killed_by_a_real_time_signal_fails_alone(sandbox, problem):
    """Signal 40 has no name in Python's enum, and naming it used to fail the whole harness: no case scored."""
    outcome = sandbox.evaluate(problem, c_program("x == 3 ? (raise(40), x) : x * x", head="#include <signal.h>\n"))
    assert outcome.scores == {"c0": 1.0, "c1": 0.0}, outcome.error
    assert outcome.case_errors == {"c1": "it was killed by signal 40"}


@pytest.mark.slow
def test_a_build_that_loops_is_cut_at_its_own_time_limit(sandbox, problem):
    start = time.monotonic()
    outcome = sandbox.evaluate(problem, c_program(build="for (;;) {}"))
    elapsed = time.monotonic() - start
    assert outcome.error_kind == ErrorKind.BUILD and outcome.scores == FAILED
    assert "the build ran past its time limit" in (outcome.error or ""), outcome.error
    assert elapsed < BUILD_TIMEOUT + 2  # the build's own limit, not the job's (build + evaluation) deadline
    assert_known_c_vectors(sandbox, problem)


@pytest.fixture(scope="module")
def roomy_problem(tmp_path_factory):
    """The same problem with time to fill the scratch: on a loaded machine (the unprivileged CI pass, beside
    other work) compiling and writing it took past 2 s, and the build ended on its time limit instead."""
    return load_problem(write_c_problem(tmp_path_factory.mktemp("c"), build_timeout=FILL_BUILD_TIMEOUT))


def test_a_build_that_fills_the_disk_stops_at_the_scratch_size(sandbox, problem, roomy_problem):
    outcome = sandbox.evaluate(roomy_problem, c_program(build=FILL))
    seen = (outcome.error_kind, outcome.error, outcome.stderr[-600:], outcome.duration_s)
    assert outcome.error_kind == ErrorKind.BUILD and outcome.scores == FAILED, seen
    assert "No space left on device" in (outcome.error or ""), seen
    assert_known_c_vectors(sandbox, problem)  # the scratch was emptied: the next builds have room


def test_a_build_cannot_reach_the_hosts_network(sandbox, problem):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(3)
    got: list[object] = []
    threading.Thread(target=_accept, args=(server, got), daemon=True).start()
    port = server.getsockname()[1]
    outcome = sandbox.evaluate(problem, c_program(build=CONNECT.format(port=port), head=NETWORK_HEAD))
    assert outcome.error_kind == ErrorKind.BUILD and outcome.scores == FAILED, outcome.error
    assert "connected" not in (outcome.error or "")
    time.sleep(0.5)
    assert got == []
    server.close()
    assert_known_c_vectors(sandbox, problem)


def test_the_compiler_cannot_read_host_files_into_its_log(sandbox, problem, tmp_path):
    """`#include` of a host file would put its text in the build log, and the log into the next prompt."""
    marker = f"host-secret-{uuid.uuid4().hex}"
    secret = tmp_path / "secret.h"
    secret.write_text(f"#error {marker}\n")
    evaluator = problem.evaluator_path  # the expected answers
    for path in (secret, evaluator):
        outcome = sandbox.evaluate(problem, c_program(head=f'#include "{path}"\n'))
        assert outcome.error_kind == ErrorKind.BUILD and outcome.scores == FAILED
        assert f"{path}: No such file or directory" in (outcome.error or ""), outcome.error
        assert marker not in (outcome.error or "") and "expected" not in (outcome.error or "")
    assert_known_c_vectors(sandbox, problem)


def _procs_named(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "comm").read_text().strip() == name:
                found.append(int(entry.name))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_a_compiled_fork_bomb_is_contained(sandbox, problem):
    name = f"cbomb-{uuid.uuid4().hex[:6]}"
    bomb = c_program(run=f'prctl(15, "{name}", 0, 0, 0); for (;;) fork();', head="#include <sys/prctl.h>\n")
    start = time.monotonic()
    outcome = sandbox.evaluate(problem, bomb)
    assert not outcome.ok and outcome.scores == FAILED
    assert time.monotonic() - start < BUILD_TIMEOUT + problem.config.limits.timeout_s + 3
    deadline = time.monotonic() + 3
    while _procs_named(name) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _procs_named(name) == []
    assert_known_c_vectors(sandbox, problem)
