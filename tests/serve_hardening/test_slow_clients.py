"""`evolve serve`: slow clients are bounded and timed out, and a client trickling its request head a byte at a
time is dropped at the head's deadline."""

from __future__ import annotations

import select
import socket
import time
from contextlib import suppress
from pathlib import Path

import httpx

from tests.serve_hardening.served import (
    CAP,
    HEAD_S,
    IDLE_S,
    assert_honest,
)


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
        held, next_byte = list(trickling), started + 2.0
        while held and time.monotonic() < started + HEAD_S + 10:
            time.sleep(0.25)  # looked at often, so that the drop is seen when it comes (not up to 2 s late)
            held = [sock for sock in held if not _gone(sock)]
            if time.monotonic() >= next_byte:
                next_byte += 2.0
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
