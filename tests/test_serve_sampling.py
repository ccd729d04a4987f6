"""`evolve serve` shows the group a run is sampling: the run's process publishes its policy's token count to the
archive every few seconds, the dashboard (another archive connection, as another process has) reads it back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from evolve.archive import Archive
from evolve.archive.clock import utcnow
from evolve.archive.models import SamplingProgressRow
from evolve.options import RunOptions
from evolve.problem import load_problem
from evolve.runs import open_run
from evolve.sampling_feed import feed_sampling
from policies.policy import SamplingProgress
from tests.helpers import write_square_problem


class CountingPolicy:
    """What the feed reads of a policy: the same `SamplingProgress` the llama and transformers policies count in."""

    name, version, max_concurrency = "counting", 0, 1

    def __init__(self) -> None:
        self.progress = SamplingProgress()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Archive, int, str]]:
    from evolve.report.server import make_dashboard

    db = tmp_path / "runs.db"
    writer = Archive(db)
    problem = load_problem(write_square_problem(tmp_path / "square"))
    run = open_run(writer, problem, RunOptions.for_problem(problem.config.search, policy="embedded")).run
    reader = Archive(db, create=False)
    server = make_dashboard(reader, run.id, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield writer, run.id, f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(timeout=10)
    reader.close()
    writer.close()


def _line_becomes(url: str, run_id: int, wanted: object, timeout: float = 20.0) -> str:
    deadline = time.monotonic() + timeout
    line = None
    while time.monotonic() < deadline:
        line = httpx.get(f"{url}/api/sampling", params={"run": run_id}, timeout=30).json()["line"]
        if wanted(line) if callable(wanted) else line == wanted:
            return line
        time.sleep(0.05)
    raise AssertionError(f"the served line stayed {line!r}")


def test_serve_shows_the_group_being_sampled_and_nothing_between_groups(served) -> None:
    archive, run_id, url = served
    policy = CountingPolicy()
    done = threading.Event()
    feeder = threading.Thread(target=feed_sampling, args=(policy, archive, run_id, done, 0.05), daemon=True)
    feeder.start()
    try:
        assert httpx.get(f"{url}/api/sampling", params={"run": run_id}, timeout=30).json() == {"line": ""}
        page = httpx.get(f"{url}/", timeout=60).text
        assert 'id="sampling"' in page and "/api/sampling" in page

        policy.progress.start(4, 128, 517)  # the prompt's decode: no token yet
        reading = _line_becomes(url, run_id, lambda s: "reading the prompt" in s)
        assert reading.startswith("sampling 4 rows: reading the prompt (517 new tokens)")

        policy.progress.started = time.monotonic() - 40  # 40 s into the group: 312 tokens, one row finished
        policy.progress.tokens, policy.progress.rows_done = 312, 1
        line = _line_becomes(url, run_id, lambda s: "312 tokens" in s)
        assert "1/4 rows done" in line
        rate = float(line.split("312 tokens, ")[1].split(" tok/s")[0])
        assert 7.0 <= rate <= 7.9  # 312 tokens over 40-44 s
        assert int(line.rsplit(", ", 1)[1].removesuffix(" s")) >= 40

        policy.progress.active = False  # the group ended: the row is cleared
        _line_becomes(url, run_id, "")
    finally:
        done.set()
        feeder.join(timeout=5)


def test_a_stale_or_stopped_runs_progress_is_not_shown(served) -> None:
    from evolve.archive.progress import SamplingSnapshot, publish_sampling

    archive, run_id, url = served
    publish_sampling(archive, run_id, SamplingSnapshot(4, 0, 100, 50, 10.0))
    assert "100 tokens" in _line_becomes(url, run_id, lambda s: s != "")
    with archive.db.session() as s:  # written a minute ago: the run's process is gone (killed), not sampling
        s.execute(update(SamplingProgressRow).values(updated_at=utcnow() - timedelta(seconds=60)))
    _line_becomes(url, run_id, "")
    publish_sampling(archive, run_id, SamplingSnapshot(4, 0, 100, 50, 10.0))
    assert _line_becomes(url, run_id, lambda s: s != "")
    archive.update_run(run_id, status="finished")
    _line_becomes(url, run_id, "")
