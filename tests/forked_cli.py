"""`evolve ARGS` as a process of its own, forked from a process that has already imported the CLI.

Why: a fresh `python -m evolve.cli` spends one to two seconds of a loaded core importing SQLAlchemy, Alembic and
the engine before it reads its first argument, and the output-write tests run about forty short commands. Each
command here is still a process of its own, as a user runs it: its own pid, working folder, argv, stdin (empty),
stdout and stderr (files read back), exit status, and `evolve/cli/__main__.py` run as `__main__` in it. It is
forked from a server process that imported `evolve.cli` and did nothing else, so nothing one command does
reaches the next, and an uncaught exception ends it as Python ends any process: a traceback and status 1.

Its ending is Python's own up to the interpreter's teardown: its threads joined, its atexit functions run (the
weakref finalizers among them), stdout and stderr flushed; then `os._exit`. Tearing down every module the
engine imported took one and a half seconds of a loaded core per command and writes nothing a test reads.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVER = r"""
import atexit, json, os, runpy, sys, threading, traceback
import evolve.cli  # the cost every fresh `python -m evolve.cli` pays, paid once here


def command_status():  # `python -m evolve.cli` in this process; its exit status, as the interpreter makes it
    try:
        runpy.run_module("evolve.cli", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def leave(status):
    threading._shutdown()  # what the interpreter does first on exit: wait for the threads that are not daemons
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


requests, answers = sys.stdin, sys.stdout
for line in requests:
    ask = json.loads(line)
    answers.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the command's own process: its folder, argv and stdio, then the CLI's __main__ as python -m runs it
        os.chdir(ask["cwd"])
        streams = ((0, os.devnull, os.O_RDONLY), (1, ask["out"], os.O_WRONLY), (2, ask["err"], os.O_WRONLY))
        for fd, path, mode in streams:
            opened = os.open(path, mode)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, closefd=False)  # not the server's buffered requests
        sys.argv = [ask["argv0"], *ask["args"]]
        leave(command_status())
    answers.write(json.dumps({"pid": pid}) + "\n")
    answers.flush()
    _, status = os.waitpid(pid, 0)
    answers.write(json.dumps({"pid": pid, "rc": os.waitstatus_to_exitcode(status)}) + "\n")
    answers.flush()
"""


class ForkedCli:
    """One server per test process, started at the first command; it ends when this process closes its stdin."""

    def __init__(self) -> None:
        self._server: subprocess.Popen[str] | None = None
        self._pending = b""

    def start(self) -> subprocess.Popen[str]:
        """The server, started now if it is not running (its imports go on while the caller does other things)."""
        if self._server is None or self._server.poll() is not None:
            cmd = [sys.executable, "-c", SERVER]
            self._server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self._pending = b""
            atexit.register(self._server.kill)
        return self._server

    def run(self, args: list[str], cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """`evolve ARGS` run in `cwd` (this process's folder by default), as subprocess.run would give it back."""
        server = self.start()
        with tempfile.TemporaryDirectory(prefix="evolve-cmd-") as temp:
            out, err = Path(temp) / "stdout", Path(temp) / "stderr"
            out.touch()
            err.touch()
            ask = {"argv0": "evolve", "args": args, "cwd": str(cwd or os.getcwd()), "out": str(out), "err": str(err)}
            server.stdin.write(json.dumps(ask) + "\n")  # type: ignore[union-attr]
            server.stdin.flush()  # type: ignore[union-attr]
            pid = self._answer(server, 300)["pid"]  # the first waits for the imports
            try:
                status = self._answer(server, timeout)["rc"]
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):  # as subprocess.run ends a command that overran
                    os.kill(pid, signal.SIGKILL)
                self._answer(server, 60)
                raise subprocess.TimeoutExpired(["evolve", *args], timeout, out.read_text(), err.read_text()) from None
            return subprocess.CompletedProcess(["evolve", *args], status, out.read_text(), err.read_text())

    def _answer(self, server: subprocess.Popen[str], timeout: float) -> dict[str, int]:
        """The server's next line: the command's pid once forked, its exit status once it ended (read from the pipe
        itself, since a buffered reader could hold the second line where `select` does not see it)."""
        deadline = time.monotonic() + timeout
        fd = server.stdout.fileno()  # type: ignore[union-attr]
        while b"\n" not in self._pending:
            if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                raise subprocess.TimeoutExpired("evolve", timeout)
            more = os.read(fd, 4096)
            assert more, f"the forking server of `evolve` commands ended (status {server.wait()})"
            self._pending += more
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)


FORKED = ForkedCli()
