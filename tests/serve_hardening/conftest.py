"""The archive of known programs every test reads back (made once for the package), and `evolve serve` on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.serve_hardening.served import Served, known_archive, start_serve


@pytest.fixture(scope="package")
def archive_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("hardening")
    db = root / "runs.db"
    return db, known_archive(str(db), root)


@pytest.fixture
def serve() -> Iterator:
    started: list[Served] = []

    def start(db: str, *extra: str) -> Served:
        started.append(start_serve(db, *extra))
        return started[-1]

    yield start
    for served in started:
        if served.proc.poll() is None:
            served.proc.kill()
        served.proc.wait(timeout=30)
