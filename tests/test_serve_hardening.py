"""`evolve serve` under hostile or unlucky requests (issue #57, second round): a database URL is served, ids no row
can have answer 404, a page of another host name (DNS rebinding) is refused, slow clients are bounded, a failed
rebuild does not freeze the page, concurrent first requests for a run share one build, a client that trickles its
request a byte at a time is dropped at the head deadline, and a damaged archive is a one-line 503 until restored.

Each test ends by reading the known programs back through the server and asserting their exact code and score
vectors: whatever came before, the server still answers honest requests with what the archive holds.
"""

from __future__ import annotations

import select
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from evolve.archive import Archive
from evolve.options import RunOptions
from evolve.problem import load_problem
from evolve.runs import open_run
from tests.helpers import KNOWN, store_program, write_square_problem

HUGE = "99999999999999999999999999"  # past SQL's 64-bit integers: the driver cannot even bind it
ZERO = {"scores": {"c0": 0.0, "c1": 0.0}, "scalar": 0.0, "duration_s": 0.1}  # what a wrong program scores
CAP, IDLE_S = 64, 10.0  # the server's documented bounds: connections served at once, seconds a read may wait
HEAD_S = 15.0  # the server's documented bound on the seconds a request's head may take to arrive, whatever trickles


def known_archive(location: str, root: Path) -> list[tuple[int, str, dict[str, float]]]:
    """A run of the square problem holding the known programs, each with its exact vector; (id, code, vector)."""
    archive = Archive(location)
    problem = load_problem(write_square_problem(root / "square"))
    run = open_run(archive, problem, RunOptions.for_problem(problem.config.search, policy="embedded")).run
    known = []
    for code, vector in KNOWN:
        scalar = sum(vector.values()) / len(vector)
        evaluation = {"scores": vector, "scalar": scalar, "duration_s": 0.1}
        pid, _ = store_program(archive, run.id, code, evaluation=evaluation)
        known.append((pid, code, vector))
    archive.close()
    return known


def assert_honest(url: str, known: list[tuple[int, str, dict[str, float]]], **headers: str) -> None:
    """Every known program reads back with its exact code and score vector."""
    for pid, code, vector in known:
        answer = httpx.get(f"{url}/api/program/{pid}", headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        assert (answer.json()["code"], answer.json()["scores"]) == (code, vector)


@pytest.fixture(scope="module")
def archive_db(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    root = tmp_path_factory.mktemp("hardening")
    db = root / "runs.db"
    return db, known_archive(str(db), root)


@dataclass
class Served:
    proc: subprocess.Popen[str]
    url: str
    lines: list[str]

    def output(self) -> str:
        return "".join(self.lines)


def start_serve(db: str, *extra: str) -> Served:
    """`evolve serve DB --port 0` in its own process; its output is collected as it comes (the pipe never fills)."""
    cmd = [sys.executable, "-m", "evolve.cli", "serve", db, "--port", "0", *extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while not any("serving run" in line for line in lines):
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line and time.monotonic() < deadline, f"evolve serve exited before listening: {''.join(lines)}"
        lines.append(line)
    url = lines[-1].split(" at ")[1].split()[0].rstrip("/")
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()  # type: ignore[arg-type]
    return Served(proc, url, lines)


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


def _threads(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Threads:")).split()[1])


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has ended this connection (its answer, if any, read to the end)."""
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def test_slow_clients_are_bounded_and_timed_out(archive_db, serve) -> None:
    db, known = archive_db
    served = serve(str(db))
    assert_honest(served.url, known)
    before = _threads(served.proc.pid)
    port = int(served.url.rsplit(":", 1)[1])
    slow = []
    try:
        for _ in range(CAP + 36):  # half a request each, never finished
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"GET /api/data HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            slow.append(sock)
        time.sleep(1.0)
        assert _threads(served.proc.pid) <= before + CAP  # one thread per connection served, no more
        for sock in slow[CAP:]:  # past the cap: refused at once
            sock.settimeout(5)
            assert _closed_by_server(sock)
        started = time.monotonic()
        for sock in slow[:CAP]:  # served, then dropped when they send nothing for IDLE_S
            sock.settimeout(max(0.1, started + IDLE_S + 10 - time.monotonic()))
            assert _closed_by_server(sock)
        time.sleep(0.5)
        assert _threads(served.proc.pid) <= before
    finally:
        for sock in slow:
            sock.close()
    assert_honest(served.url, known)
    assert "Traceback" not in served.output()


def _gone(sock: socket.socket) -> bool:
    """Whether the server has closed this connection, without waiting (the server answers a trickler nothing)."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(4096) == b""
    except ConnectionError:
        return True


def test_clients_trickling_their_request_head_are_dropped_at_its_deadline(archive_db, serve) -> None:
    """A slow-loris client: half a header line, then one byte every 2 s, each read well inside IDLE_S. Every
    slot held so is given back HEAD_S after the connection came, and honest requests are served again."""
    db, known = archive_db
    served = serve(str(db))
    port = int(served.url.rsplit(":", 1)[1])
    trickling = []
    try:
        for _ in range(CAP + 4):  # every slot taken, and a few answered 503 at once
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-a: ")
            trickling.append(sock)
        started = time.monotonic()
        held = list(trickling)
        while held and time.monotonic() < started + HEAD_S + 10:
            time.sleep(2.0)
            held = [sock for sock in held if not _gone(sock)]
            for sock in held:
                with suppress(OSError):  # closed between the look and the byte
                    sock.sendall(b"a")
        dropped_after = time.monotonic() - started
        assert held == [], f"{len(held)} trickling connections still held after {dropped_after:.0f} s"
        assert dropped_after < HEAD_S + 5
        answers = [httpx.get(f"{served.url}/api/data", timeout=60).status_code for _ in range(20)]
        assert answers == [200] * 20
    finally:
        for sock in trickling:
            sock.close()
    assert_honest(served.url, known)
    assert "Traceback" not in served.output()


def _damage(db: Path) -> None:
    """Noise over the first page of the programs and evaluations tables: the file opens, its runs still read."""
    with sqlite3.connect(db) as con:
        size = con.execute("PRAGMA page_size").fetchone()[0]
        roots = dict(con.execute("SELECT name, rootpage FROM sqlite_master WHERE type = 'table'").fetchall())
    with db.open("r+b") as f:
        for table in ("programs", "evaluations"):
            f.seek((roots[table] - 1) * size)
            f.write(b"\xa5" * size)


def test_a_damaged_archive_answers_503_in_one_line_and_recovers_once_restored(archive_db, serve, tmp_path) -> None:
    source, known = archive_db
    db = tmp_path / "runs.db"
    shutil.copy(source, db)
    with sqlite3.connect(db) as con:  # every row in the file itself, none in a WAL beside it
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    good = db.read_bytes()
    _damage(db)  # before serving: a live server's connections hold the pages they read, damaged or not
    served = serve(str(db))
    for path in ("/", "/api/data", f"/api/program/{known[0][0]}"):
        answer = httpx.get(f"{served.url}{path}", timeout=60)
        said = answer.text.strip()
        assert (answer.status_code, "\n" in said) == (503, False), (path, answer.status_code, said)
        assert f"the archive {db} is damaged" in said and "restore it from a copy" in said, said
    db.write_bytes(good)
    assert httpx.get(f"{served.url}/", timeout=60).status_code == 200
    assert httpx.get(f"{served.url}/api/data", timeout=60).json()["meta"]["evaluations"] == len(KNOWN)
    assert_honest(served.url, known)
    assert "Traceback" not in served.output()


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
