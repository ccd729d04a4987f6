"""Unprivileged accounts for tests that act as a local user (tests/test_local_users.py): each is made for the test
and removed after it, and acts in a child forked from the test process (no new interpreter: this one's own files,
under /root, are not open to other users)."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class User:
    """An account made for a test; `run` and `holding` act as it."""

    name: str
    uid: int
    gid: int

    def _drop(self) -> None:
        os.setgroups([])
        os.setgid(self.gid)
        os.setuid(self.uid)

    def run(self, action: Callable[[], Any]) -> Any:
        """What `action` returns as this user (JSON), or the text of what it raised."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.close(read)
            try:
                self._drop()
                said = {"value": action()}
            except BaseException as exc:  # the child reports whatever ends it
                said = {"error": f"{type(exc).__name__}: {exc}"}
            os.write(write, json.dumps(said).encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read, "rb") as pipe:
            said = json.loads(pipe.read() or b'{"error": "the child said nothing"}')
        os.waitpid(pid, 0)
        if "error" in said:
            raise AssertionError(f"as {self.name}: {said['error']}")
        return said["value"]

    @contextlib.contextmanager
    def holding(self, action: Callable[[], Any]) -> Iterator[int]:
        """As this user, `action` (which takes a lock, say) in a child that keeps what it opened until the block
        ends; yields that child's pid."""
        ready_r, ready_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            os.close(ready_r)
            os.close(done_w)
            try:
                self._drop()
                kept = action()  # noqa: F841 - held open until the parent lets go
                os.write(ready_w, b"ok")
            except BaseException as exc:
                os.write(ready_w, f"{type(exc).__name__}: {exc}".encode())
                os._exit(1)
            os.read(done_r, 1)  # returns at EOF: the parent closed its end
            os._exit(0)
        os.close(ready_w)
        os.close(done_r)
        try:
            said = os.read(ready_r, 4096).decode()
            assert said == "ok", f"as {self.name}: {said}"
            yield pid
        finally:
            os.close(ready_r)
            os.close(done_w)
            os.waitpid(pid, 0)


def _make(name: str) -> User:
    for _ in range(20):  # another test may hold /etc/passwd's lock for a moment
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
        )
        if made.returncode == 0:
            entry = pwd.getpwnam(name)
            return User(name, entry.pw_uid, entry.pw_gid)
        time.sleep(0.5)
    pytest.skip(f"cannot make an account: {made.stderr.strip()}")


@contextlib.contextmanager
def account(name: str) -> Iterator[User]:
    """A system account of this name (no home, no login shell), removed with its group when the block ends."""
    user = _make(name)
    try:
        yield user
    finally:
        subprocess.run(["userdel", user.name], capture_output=True)
