"""Files of the model cache, each built by one process while any other that needs it waits, then uses it.

Two processes starting at once on a fresh machine (two study lanes, a run and `evolve train`) had built the same
file side by side, and one failed on the other's rename. A build killed halfway leaves only its staging file,
which the next build writes over; a build that fails (Ctrl-C, a full disk) removes it.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from policies.policy import PolicyError

log = logging.getLogger(__name__)
FIX = "set EVOLVE_CACHE to a folder you may write"


def _lock_descriptor(folder: Path) -> int:
    """The folder's lock file, read-only where another user made it (flock needs no write access)."""
    path = folder / ".build.lock"
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:
        return os.open(path, os.O_RDONLY)


@contextmanager
def building(folder: Path, what: str) -> Iterator[None]:
    """Hold `folder`'s build lock; say once that this process waits when another holds it (a build can take
    minutes, and a silent wait looks like a hang)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = _lock_descriptor(folder)
    except OSError as exc:
        raise PolicyError(f"{folder}: cannot build {what} there ({exc.strerror}); {FIX}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another process that is building %s in %s", what, folder)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def build_once(
    target: Path,
    what: str,
    write: Callable[[Path], None],
    ready: Callable[[], bool],
    then: Callable[[], None] = lambda: None,
) -> Path:
    """`target` as `write(staging)` makes it, unless `ready()` says it is built; the rename commits it, and
    `then` (a marker that `ready` reads, say) runs after the rename, still under the lock."""
    if ready():
        return target
    with building(target.parent, what):
        if ready():
            return target
        staging = target.with_name(target.name + ".partial")
        try:
            write(staging)
            staging.replace(target)
            then()
        except OSError as exc:
            staging.unlink(missing_ok=True)
            raise PolicyError(f"{target}: cannot build {what} ({exc.strerror or exc}); {FIX}") from None
        except BaseException:
            staging.unlink(missing_ok=True)
            raise
    return target
