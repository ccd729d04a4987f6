"""One warm sandbox container: started, waited for until its runner is ready, asked one job at a time, destroyed.

The container runs `container_runner.py` as its main process (behind Docker's init) and talks JSON lines over
its attached stdin/stdout (attach_channel.py). Each request carries a fresh nonce, and only the line that
echoes it is the job's answer: anything else on the channel (a line before the ready line, a stray line while
idle, more than one answer) marks the channel as untrusted, and the pool (docker_pool.py) then replaces the
container. Removal is left to a background thread, since the daemon may take many seconds over it.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from typing import Any

from sandboxes.attach_channel import UNEXPECTED, AttachChannel

# For a runner to say it is ready: a second or two when idle, far more under load (one that ended says so at once)
READY_WAIT_S = 120.0


class WarmContainer:
    def __init__(self, client: Any, settings: dict[str, Any], spawn: bool) -> None:
        """Create and start a container with `settings` (docker_lockdown.container_settings); a container the
        daemon refuses to start is removed before the error is raised."""
        self.container = client.containers.create(**settings)
        self.spawn, self.uses, self._stray = spawn, 0, False
        self.made_for: object = None  # the problem (its root) the pool made it for: never reused for another
        attach = None
        try:
            attach = self.container.attach_socket(params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self.container.start()
        except Exception:  # refused (a mount it could not make): removed, not left behind as a created container
            if attach is not None:
                with contextlib.suppress(Exception):
                    attach.close()
            remove_quietly(self.container)
            raise
        self._attach, self._channel = attach, AttachChannel(attach._sock)

    def wait_ready(self) -> bool:
        """Read up to the runner's ready line: False (the container destroyed) when the channel closed first, or
        READY_WAIT_S passed. A line before it is no answer (no job was sent), but the channel carried something
        not the runner's: like a stray line while idle, it makes the first request UNEXPECTED."""
        deadline = time.monotonic() + READY_WAIT_S
        while (line := self._channel.read_line(deadline)) != {"ready": True}:
            if line is None:
                self.destroy()
                return False
            self._stray = True
        return True

    def request(self, job: dict[str, Any], timeout_s: float) -> Any:
        """This job's answer; None when the container is silent or gone; UNEXPECTED when any other line came,
        or more than the answer did (the channel then cannot be trusted for later jobs either)."""
        self.uses += 1
        if self._stray:
            return UNEXPECTED
        nonce = secrets.token_hex(16)
        if not self._channel.send_line({**job, "spawn": self.spawn, "nonce": nonce}):
            return None
        answer = self._channel.read_line(time.monotonic() + timeout_s)
        if answer is None:
            return None
        if not isinstance(answer, dict) or answer.get("nonce") != nonce or self._channel.has_leftover:
            return UNEXPECTED
        return answer

    def interrupt(self) -> None:
        """Wake a `request()` waiting in another thread at once (it returns None; its caller destroys us)."""
        self._channel.shutdown()

    def destroy(self) -> None:
        """Close the attach socket fully, then kill and remove the container without waiting long for it."""
        for close in (self._channel.close, self._attach.close):
            with contextlib.suppress(Exception):
                close()
        with contextlib.suppress(Exception):
            self.container.kill()
        # Removal can take the daemon many seconds; the worker must not wait for it (an engine that dies first
        # leaves an orphan that the next engine removes).
        # Started before it is listed: another slot's wait_for_removals() may join anything on the list at once.
        removal = threading.Thread(target=remove_quietly, args=(self.container,), daemon=True)
        removal.start()
        with _REMOVALS_LOCK:
            _REMOVALS[:] = [*(t for t in _REMOVALS if t.is_alive()), removal]


_REMOVALS: list[threading.Thread] = []  # removals started by destroy(); wait_for_removals() joins them
_REMOVALS_LOCK = threading.Lock()  # slots destroy and wait from their own threads


def remove_quietly(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.remove(force=True, v=True)


def wait_for_removals(timeout_s: float) -> None:
    """Wait until every removal destroy() started has finished, for at most `timeout_s` in all."""
    deadline = time.monotonic() + timeout_s
    with _REMOVALS_LOCK:  # joined from a copy: two slots waiting at once each wait for every removal
        started = list(_REMOVALS)
    for removal in started:
        removal.join(timeout=max(0.0, deadline - time.monotonic()))
    with _REMOVALS_LOCK:
        _REMOVALS[:] = [t for t in _REMOVALS if t.is_alive()]
