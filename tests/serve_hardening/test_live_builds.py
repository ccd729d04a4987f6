"""`evolve serve` in process: a failed rebuild does not freeze the live page, concurrent first requests share one
build, and a failed first build is a one-line 503 that the next request builds again."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from evolve.archive import Archive
from tests.helpers import KNOWN, store_program
from tests.serve_hardening.served import (
    ZERO,
    assert_honest,
    known_archive,
)


@pytest.fixture
def in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """The dashboard `evolve serve` runs, in this process, so that a test can count or fail its payload builds."""
    import evolve.report.server as server_module
    from evolve.report.server import make_dashboard

    known = known_archive(str(tmp_path / "runs.db"), tmp_path)
    archive = Archive(tmp_path / "runs.db", create=False)
    real, builds = server_module.payload, []
    fail_on: set[int] = set()

    def counted(*args: object, **kwargs: object) -> dict:
        builds.append(threading.current_thread().name)
        time.sleep(0.3)  # a build takes a while: concurrent requests overlap it
        if len(builds) in fail_on:
            raise RuntimeError("database is locked")  # what SQLite says when a writer holds it too long
        return real(*args, **kwargs)

    monkeypatch.setattr(server_module, "payload", counted)
    servers = []

    def start(default_run: int) -> str:
        server = make_dashboard(archive, default_run, "127.0.0.1", 0)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}"

    yield archive, known, builds, fail_on, start
    for server in servers:
        server.shutdown()
        server.server_close()
    archive.close()


def _evaluations(url: str) -> int:
    return httpx.get(f"{url}/api/data", timeout=60).json()["meta"]["evaluations"]


def test_a_failed_rebuild_does_not_freeze_the_live_page(in_process) -> None:
    archive, known, builds, fail_on, start = in_process
    run_id = archive.runs()[-1].id
    url = start(run_id)  # build 1: the warm one
    assert _evaluations(url) == len(KNOWN) and len(builds) == 1
    fail_on.add(2)  # the next rebuild fails, as one would on a dropped connection or a locked read
    store_program(archive, run_id, "def solve(x):\n    return 3\n", evaluation=ZERO)
    assert _evaluations(url) == len(KNOWN)  # the held page, while build 2 runs in the background (and fails)
    deadline = time.monotonic() + 10
    while len(builds) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # build 2 has failed by now
    store_program(archive, run_id, "def solve(x):\n    return 5\n", evaluation=ZERO)
    deadline, seen = time.monotonic() + 20, _evaluations(url)
    while seen != len(KNOWN) + 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        seen = _evaluations(url)
    assert seen == len(KNOWN) + 2, f"the page stayed at {seen} evaluations after {len(builds)} builds"
    assert_honest(url, known)


def test_concurrent_first_requests_for_a_run_share_one_build(in_process) -> None:
    archive, known, builds, _, start = in_process
    url = start(99)  # no run 99: nothing is warmed, as for a second run of an archive
    assert builds == []
    run_id = archive.runs()[-1].id
    answers: list[httpx.Response] = []
    asks = [
        threading.Thread(target=lambda: answers.append(httpx.get(f"{url}/api/data?run={run_id}", timeout=120)))
        for _ in range(8)
    ]
    for ask in asks:
        ask.start()
    for ask in asks:
        ask.join(timeout=120)
    assert [a.status_code for a in answers] == [200] * 8
    assert len({a.json()["key"] for a in answers}) == 1 and len(builds) == 1
    assert_honest(url, known)


def test_a_failed_first_build_answers_503_in_one_line_and_the_next_request_builds(in_process) -> None:
    archive, known, builds, fail_on, start = in_process
    url = start(99)
    run_id = archive.runs()[-1].id
    fail_on.add(1)
    answers: list[httpx.Response] = []
    asks = [
        threading.Thread(target=lambda: answers.append(httpx.get(f"{url}/?run={run_id}", timeout=120)))
        for _ in range(4)
    ]
    for ask in asks:
        ask.start()
    for ask in asks:
        ask.join(timeout=120)
    assert [a.status_code for a in answers] == [503] * 4 and len(builds) == 1
    said = answers[0].text.strip()
    assert "\n" not in said and f"run {run_id}" in said and "database is locked" in said
    assert httpx.get(f"{url}/api/data", timeout=60).status_code == 404  # the default run, 99, is not there
    assert httpx.get(f"{url}/api/data?run={run_id}", timeout=60).json()["meta"]["evaluations"] == len(KNOWN)
    assert len(builds) == 2
    assert_honest(url, known)
