"""JSON lines over a container's attached stdin/stdout: the only wire between the engine and a container runner.

Docker multiplexes an attached container's stdout and stderr on one socket, each frame behind an 8-byte header
(stream id, then a big-endian length). This module undoes that framing, keeps stdout only, and splits it into
JSON lines. It trusts nothing it reads: a line that is not JSON, or grows past LINE_CAP, is UNEXPECTED rather
than an error, so the caller (warm_container.py) can throw the container away instead of the evaluation.
"""

from __future__ import annotations

import json
import socket
import struct
import time
from typing import Any

LINE_CAP = 24 * 1024 * 1024  # the runner's answer: an 8 MiB reply plus capped output, JSON-escaped
UNEXPECTED = object()  # a line on the channel that is not the answer to the job just sent
STDOUT = 1  # Docker's stream id for the container's stdout in a frame header


class AttachChannel:
    """One attach socket, read as JSON lines with a deadline per read."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf, self._scanned = bytearray(), 0

    @property
    def has_leftover(self) -> bool:
        """True when bytes beyond the last line read are waiting: more came than one answer."""
        return bool(self._buf)

    def send_line(self, message: dict[str, Any]) -> bool:
        """Write one JSON line; False when the socket is gone."""
        try:
            self._sock.sendall((json.dumps(message) + "\n").encode())
        except OSError:
            return False
        return True

    def read_line(self, deadline: float) -> Any:
        """The next JSON line on the container's stdout (stderr frames are dropped); None on EOF/deadline,
        UNEXPECTED for a line that is not JSON or longer than LINE_CAP (the runner's own answers never are).

        Frames are appended to one bytearray (amortised linear) and only the new frame is searched for the end
        of line, so a dense reply costs time linear in its size."""
        while True:
            end = self._buf.find(b"\n", self._scanned)
            if end >= 0:
                break
            self._scanned = len(self._buf)
            if len(self._buf) > LINE_CAP:
                return UNEXPECTED
            header = self._recv(8, deadline)
            if header is None:
                return None
            stream, size = header[0], struct.unpack(">I", header[4:])[0]
            payload = self._recv(size, deadline)
            if payload is None:
                return None
            if stream == STDOUT:
                self._buf += payload
        line = bytes(self._buf[:end])
        del self._buf[: end + 1]
        self._scanned = 0
        try:
            return json.loads(line)
        except (ValueError, RecursionError):
            return UNEXPECTED

    def _recv(self, n: int, deadline: float) -> bytes | None:
        data = bytearray()
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._sock.settimeout(left)
            try:
                chunk = self._sock.recv(n - len(data))
            except OSError:
                return None
            if not chunk:
                return None
            data += chunk
        return bytes(data)

    def shutdown(self) -> None:
        """Wake a read waiting in another thread at once (it returns None)."""
        self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._sock.close()
