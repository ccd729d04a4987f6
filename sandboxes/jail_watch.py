"""The engine's hold on one jailed job: the host pid of the jail's init, and the init's report of how it ended.

Ending a job never rests on what ran inside it. bubblewrap tells the engine (`--info-fd`) the host pid of the
jail's first process and the inode of its pid namespace; the engine opens a pidfd on it at once, checks that it
is that namespace's init (not a pid reused after an early death), and at the job's end sends it SIGKILL through
the pidfd. A SIGKILL from outside the namespace always kills its init, and the kernel then kills every process
left in the namespace, whatever the job did to its init, its parent-death signals, sessions or environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import threading
import time
from dataclasses import dataclass

from sandboxes.jail_init import JAIL_MADE  # the init's first words: one constant for both sides of the pipe

INFO_WAIT_S = 30.0  # bubblewrap writes its info right after clone; it only waits this long when it failed
GONE_WITHIN_S = 5.0  # a namespace whose init was SIGKILLed empties in milliseconds
STATUS_CAP = 4096
CPU_SLACK_S = 0.5  # CPU time is accounted in ticks: a process stopped by its limit may show a little less


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


@dataclass(frozen=True)
class InitReport:
    """What the jail's init (sandboxes/jail_init.py) saw: the harness's exit code or signal, and the CPU seconds
    of every process of the job that it reaped."""

    exit_code: int | None
    signal: int | None
    cpu_s: float

    def status(self, cpu_limit_s: float) -> str:
        """How the harness ended. A death by SIGXCPU, or by the SIGKILL of the hard CPU limit, is a timeout only
        when the job's processes really spent the CPU limit; a candidate that killed itself with either (or
        exited with 137 or 152, which bubblewrap could not tell from those signals) is a crash that says so."""
        if self.signal is None:
            return f"exit {self.exit_code}"
        if self.signal in (signal.SIGXCPU, signal.SIGKILL) and self.cpu_s >= cpu_limit_s - CPU_SLACK_S:
            return "timeout"
        return f"signal {signal_name(self.signal)}"


@dataclass(frozen=True)
class InitWords:
    """What the init wrote: `started` once the jail was made, just before the harness started (nothing of the
    candidate's can run before it), and its report of how the harness ended (None when it wrote none: killed
    first, or never started)."""

    started: bool
    report: InitReport | None


@dataclass
class JailPipes:
    """The two pipes between the engine and one jail: bubblewrap's info, and the init's words (the jail made, then
    its report). The write ends
    go to bubblewrap (closed here once it started); the read ends stay with the engine."""

    info_r: int
    info_w: int
    status_r: int
    status_w: int

    @classmethod
    def make(cls) -> JailPipes:
        info_r, info_w = os.pipe()
        status_r, status_w = os.pipe()
        return cls(info_r, info_w, status_r, status_w)

    @property
    def write_ends(self) -> tuple[int, ...]:
        return (self.info_w, self.status_w)

    def close_write_ends(self) -> None:
        for fd in self.write_ends:
            with contextlib.suppress(OSError):
                os.close(fd)

    def close_read_ends(self) -> None:
        for fd in (self.info_r, self.status_r):
            with contextlib.suppress(OSError):
                os.close(fd)


def _read_json_object(fd: int, wait_s: float) -> dict | None:
    """The first JSON object written on `fd` (bubblewrap's info): read until it parses, EOF, or `wait_s`."""
    deadline = time.monotonic() + wait_s
    data = b""
    while len(data) < STATUS_CAP:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        chunk = os.read(fd, STATUS_CAP)
        if not chunk:
            break
        data += chunk
        end = data.find(b"}")
        if end >= 0:
            data = data[: end + 1]
            break
    try:
        found = json.loads(data)
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


class JailWatch:
    """Attach once bubblewrap has started; `end()` kills the job's whole pid namespace; `words()` reads the init."""

    def __init__(self, pipes: JailPipes) -> None:
        self._pipes = pipes
        self._pidfd: int | None = None
        self._lock = threading.Lock()  # Ctrl-C ends a job from another thread

    @property
    def attached(self) -> bool:
        return self._pidfd is not None

    def attach(self) -> None:
        """Open a pidfd on the jail's init. bubblewrap is still alive and the init's parent while it sets the jail
        up, so the pid cannot have been reused yet, unless the jail already failed; the namespace check tells."""
        info = _read_json_object(self._pipes.info_r, INFO_WAIT_S)
        if not info or not isinstance(info.get("child-pid"), int):
            return
        pid = info["child-pid"]
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            return
        try:
            same = os.stat(f"/proc/{pid}/ns/pid").st_ino == info.get("pid-namespace")
        except OSError:
            same = False
        if same:
            self._pidfd = pidfd
        else:
            os.close(pidfd)

    def end(self) -> bool:
        """SIGKILL the namespace's init and wait until the kernel has emptied the namespace: True once it is gone.
        Safe to call more than once, and when the job already ended by itself."""
        with self._lock:
            if self._pidfd is None:
                return True
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            ready, _, _ = select.select([self._pidfd], [], [], GONE_WITHIN_S)
            return bool(ready)

    def words(self) -> InitWords:
        """What the init wrote, read once the job has ended."""
        fd = self._pipes.status_r
        os.set_blocking(fd, False)
        try:
            data = os.read(fd, STATUS_CAP)
        except BlockingIOError:
            return InitWords(False, None)
        started = data.startswith(JAIL_MADE)
        try:
            found = json.loads(data.removeprefix(JAIL_MADE).split(b"\n", 1)[0])
            cpu_s = float(found.get("cpu_s", 0.0))
        except (ValueError, AttributeError, TypeError):
            return InitWords(started, None)
        code, number = found.get("exit"), found.get("signal")
        report = InitReport(code if isinstance(code, int) else None, number if isinstance(number, int) else None, cpu_s)
        return InitWords(started, report)

    def close(self) -> None:
        with self._lock:
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None
            self._pipes.close_read_ends()
