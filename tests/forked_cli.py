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

Its environment is this process's as it was when the server started (the first command), or `env` where given:
a variable the engine reads as it imports takes the server's value, so a test that sets one of those starts its
command with subprocess as before. Commands may run at once (a run, and a
second one that its session lock refuses): the server forks each as it is asked and says when each ends.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SERVER = r"""
import atexit, json, os, runpy, select, sys, threading, traceback
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


def say(answer):
    os.write(1, (json.dumps(answer) + "\n").encode())


def start(ask):
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the command's own process: its folder, argv and stdio, then the CLI's __main__ as python -m runs it
        os.chdir(ask["cwd"])
        if ask["env"] is not None:
            os.environ.clear()
            os.environ.update(ask["env"])
        streams = ((0, os.devnull, os.O_RDONLY), (1, ask["out"], os.O_WRONLY), (2, ask["err"], os.O_WRONLY))
        for fd, path, mode in streams:
            opened = os.open(path, mode)
            os.dup2(opened, fd)
            os.close(opened)
        sys.stdin = open(0, closefd=False)
        sys.argv = [ask["argv0"], *ask["args"]]
        leave(command_status())
    say({"pid": pid})


def reap():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        say({"pid": pid, "rc": os.waitstatus_to_exitcode(status)})


pending = b""
while True:
    reap()
    if not select.select([0], [], [], 0.05)[0]:
        continue
    more = os.read(0, 65536)
    if not more:
        break
    pending += more
    while b"\n" in pending:
        line, pending = pending.split(b"\n", 1)
        start(json.loads(line))
"""


class Forked:
    """A command the server forked: its pid, whether it ended, and its output once it has."""

    def __init__(self, cli: ForkedCli, pid: int, args: list[str], folder: Path) -> None:
        self.cli, self.pid, self.args, self.folder = cli, pid, args, folder

    def poll(self) -> int | None:
        """Its exit status, or None while it runs."""
        self.cli.read_answers(0)
        return self.cli.ended.get(self.pid)

    def kill(self) -> None:
        if self.poll() is None:  # not yet reaped by the server, so the pid is still this command's
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """Its end, as subprocess.run gives it back; past `timeout` it is killed, as subprocess.run does."""
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                self.kill()
                self._wait_end(time.monotonic() + 60)
                out, err = self._output()
                raise subprocess.TimeoutExpired(["evolve", *self.args], timeout, out, err)
            self.cli.read_answers(min(1.0, max(0.0, deadline - time.monotonic())))
        out, err = self._output()
        return subprocess.CompletedProcess(["evolve", *self.args], self.cli.ended[self.pid], out, err)

    def _wait_end(self, deadline: float) -> None:
        while self.poll() is None and time.monotonic() < deadline:
            self.cli.read_answers(1.0)

    def _output(self) -> tuple[str, str]:
        out, err = (self.folder / "stdout").read_text(), (self.folder / "stderr").read_text()
        if self.poll() is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        return out, err


class ForkedCli:
    """One server per test process, started at the first command; it ends when this process closes its stdin."""

    def __init__(self) -> None:
        self._server: subprocess.Popen[str] | None = None
        self._pending = b""
        self.started: list[int] = []
        self.ended: dict[int, int] = {}

    def start(self) -> subprocess.Popen[str]:
        """The server, started now if it is not running (its imports go on while the caller does other things)."""
        if self._server is None or self._server.poll() is not None:
            cmd = [sys.executable, "-c", SERVER]
            self._server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            self._pending, self.started, self.ended = b"", [], {}
            atexit.register(self._server.kill)
        return self._server

    def spawn(self, args: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> Forked:
        """`evolve ARGS` started in `cwd` (this process's folder by default) with `env` (the server's by default); it
        runs while the caller goes on."""
        server = self.start()
        folder = Path(tempfile.mkdtemp(prefix="evolve-cmd-"))
        (folder / "stdout").touch()
        (folder / "stderr").touch()
        where = str(cwd or os.getcwd())
        ask = {
            "argv0": "evolve",
            "args": args,
            "cwd": where,
            "out": str(folder / "stdout"),
            "err": str(folder / "stderr"),
            "env": env,
        }
        server.stdin.write(json.dumps(ask) + "\n")  # type: ignore[union-attr]
        server.stdin.flush()  # type: ignore[union-attr]
        deadline = time.monotonic() + 300  # the first command waits for the server's imports
        while not self.started:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["evolve", *args], 300)
            self.read_answers(1.0)
        return Forked(self, self.started.pop(0), args, folder)

    def run(
        self, args: list[str], cwd: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`evolve ARGS` run in `cwd` with `env` to its end, as subprocess.run would give it back."""
        return self.spawn(args, cwd, env).wait(timeout)

    def read_answers(self, timeout: float) -> None:
        """The server's lines that came within `timeout`: a command forked (its pid), or one ended (its status). Read
        from the pipe itself, since a buffered reader could hold a line where `select` does not see it."""
        server = self.start()
        fd = server.stdout.fileno()  # type: ignore[union-attr]
        if not select.select([fd], [], [], timeout)[0]:
            return
        more = os.read(fd, 65536)
        assert more, f"the forking server of `evolve` commands ended (status {server.wait()})"
        self._pending += more
        while b"\n" in self._pending:
            line, self._pending = self._pending.split(b"\n", 1)
            answer = json.loads(line)
            if "rc" in answer:
                self.ended[answer["pid"]] = answer["rc"]
            else:
                self.started.append(answer["pid"])


FORKED = ForkedCli()
