"""`evolve serve`: a database URL is served; ids no row can have answer 404; a page of another host name (DNS
rebinding) is refused; a port in use is one line; bound to every interface it answers its own names only."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from evolve.archive import Archive
from tests.serve_hardening.served import (
    HUGE,
    assert_honest,
    known_archive,
)


@pytest.mark.parametrize("kind", ["sqlite-url", "postgresql"])
def test_serve_takes_a_database_url(kind: str, tmp_path: Path, serve, request: pytest.FixtureRequest) -> None:
    if kind == "postgresql":
        location = request.getfixturevalue("postgres_cluster").new_database()
    else:
        location = f"sqlite:///{tmp_path / 'runs.db'}"  # four slashes: an absolute path
    known = known_archive(location, tmp_path)
    served = serve(location)
    page = httpx.get(f"{served.url}/", timeout=60)
    assert page.status_code == 200 and "square: run 1" in page.text
    assert_honest(served.url, known)


def test_ids_no_row_can_have_answer_404_without_a_traceback(archive_db, serve) -> None:
    db, known = archive_db
    served = serve(str(db))
    for path in (
        f"/api/program/{HUGE}",
        f"/api/lineage/{HUGE}",
        "/api/program/0",
        f"/api/data?run={HUGE}",
        f"/api/sampling?run={HUGE}",
        f"/?run={HUGE}",
        "/api/data?run=abc",
        "/api/data?run=1.5",
        "/api/data?run=-1",
        "/?run=",
    ):
        answer = httpx.get(f"{served.url}{path}", timeout=60)
        assert answer.status_code == 404, (path, answer.status_code)
    assert httpx.get(f"{served.url}/api/data?run=1", timeout=60).status_code == 200
    assert_honest(served.url, known)
    assert "Traceback" not in served.output() and "OverflowError" not in served.output()


def test_a_page_of_another_host_name_is_refused(archive_db, serve) -> None:
    db, known = archive_db
    served = serve(str(db))
    port = served.url.rsplit(":", 1)[1]
    pid, code, _ = known[0]
    for host in (f"evil.example:{port}", "evil.example", f"127.0.0.1.evil.example:{port}", f"localhost.:{port}"):
        for path in ("/", "/api/data", f"/api/program/{pid}", f"/api/lineage/{pid}", "/api/sampling"):
            answer = httpx.get(f"{served.url}{path}", headers={"Host": host}, timeout=60)
            assert answer.status_code == 421, (host, path, answer.status_code)
            assert code not in answer.text and "\n" not in answer.text.rstrip("\n")
    for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", f"LOCALHOST:{port}", f"[::1]:{port}"):
        assert_honest(served.url, known, Host=host)


def test_a_port_in_use_is_said_in_one_line_with_exit_2(archive_db) -> None:
    db, _ = archive_db
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "evolve.cli", "serve", str(db), "--port", str(port)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    said = (done.stdout + done.stderr).strip().splitlines()
    assert (done.returncode, len(said)) == (2, 1), said
    assert f"127.0.0.1:{port}: cannot listen" in said[0] and "--port" in said[0]


def test_bound_to_every_interface_it_answers_addresses_and_its_own_name_but_no_other(archive_db) -> None:
    """Served on 0.0.0.0, a request may name any address of the machine (a rebinding page names a domain, never
    an address) or the machine's own name. Flask's test client: nothing is bound to every interface here."""
    from evolve.report.server import create_app

    db, known = archive_db
    archive = Archive(db, create=False)
    try:
        client = create_app(archive, 1, host="0.0.0.0").test_client()
        pid, code, vector = known[0]
        for host in ("192.0.2.7:8000", "[2001:db8::7]:8000", "0.0.0.0:8000", "localhost", socket.gethostname()):
            answer = client.get(f"/api/program/{pid}", headers={"Host": host})
            assert answer.status_code == 200 and (answer.json["code"], answer.json["scores"]) == (code, vector)
        for host in ("evil.example:8000", "192.0.2.7.nip.io:8000"):
            assert client.get(f"/api/program/{pid}", headers={"Host": host}).status_code == 421
    finally:
        archive.close()
