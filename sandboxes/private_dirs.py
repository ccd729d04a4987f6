"""Folders the sandboxes keep their own files in, which no other local user can make, replace or read first.

Why: a fixed name in the shared /tmp (mode 1777) belongs to whoever makes it first. A user who made
/tmp/vpo-evolve-empty-0 before root's engine did had every bubblewrap job of root's refused; one who made
/tmp/vpo-evolve-ray-problems/<fingerprint> had root's Ray actor load her evaluator, as root (issue #57, second
red-team round, findings 19 and 22). So:

- root's folders live under /run (root's own, 0755, a tmpfs emptied at boot), each checked to be root's and closed
  to others before use (`open_root_folder`; the process sandbox's slot locks live there too);
- a user's live in the user's runtime folder ($XDG_RUNTIME_DIR, which the login manager makes 0700 for that user
  alone) when there is one, else in the temp folder under a name that carries the uid. Where that name is taken by
  someone else (made first, or a link), the user gets a folder of unpredictable name (mkdtemp) for this process
  instead, removed at its exit: the squatter costs a few bytes, not the sandbox.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

from sandboxes.sandbox import SandboxRefused

RUN = Path("/run")
_FALLBACKS: dict[str, Path] = {}  # name -> this process's own folder, where the user's fixed name was taken


def open_root_folder(path: Path, who: str) -> int:
    """A descriptor on root's folder `path`, made (0700) if missing; refused in one line (naming `who`) unless it
    and its parent are root's and closed to others, so that no user could have made, replaced or filled it."""
    fix = f"remove it (rm -r {path}) and start again"
    try:
        parent = os.stat(path.parent)
    except OSError as exc:
        raise SandboxRefused(f"{who}: {path.parent} is missing ({exc.strerror}); make it, root's, mode 0755") from exc
    if parent.st_uid != 0 or parent.st_mode & 0o022:
        raise SandboxRefused(f"{who}: {path.parent} is not root's alone; chown root and chmod go-w it")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise SandboxRefused(f"{who}: {path} is not a folder ({exc.strerror}); {fix}") from exc
    info = os.fstat(fd)
    if info.st_uid != 0 or stat.S_IMODE(info.st_mode) & 0o077:
        os.close(fd)
        raise SandboxRefused(
            f"{who}: {path} must be root's with mode 0700 (it is uid {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):04o}); {fix}"
        )
    return fd


def private_folder(name: str, who: str) -> Path:
    """This user's own folder called `name` (0700, checked): under /run for root, else see the module's note."""
    if os.geteuid() == 0:
        os.close(open_root_folder(RUN / name, who))  # under root's /run and root's 0700: nobody else can swap it
        return RUN / name
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and _is_private(Path(runtime)):
        folder = Path(runtime) / name
        if _made_private(folder):
            return folder
    folder = Path(tempfile.gettempdir()) / f"{name}-{os.geteuid()}"
    if _made_private(folder):
        return folder
    if name not in _FALLBACKS:
        try:
            made = Path(tempfile.mkdtemp(prefix=f"{name}-{os.geteuid()}-"))
        except OSError as exc:
            raise SandboxRefused(
                f"{who}: cannot make a folder of its own in {tempfile.gettempdir()} ({exc.strerror}); set TMPDIR "
                "to a folder you may write"
            ) from None
        atexit.register(shutil.rmtree, made, ignore_errors=True)
        _FALLBACKS[name] = made
    return _FALLBACKS[name]


def _made_private(folder: Path) -> bool:
    """Whether `folder` is (made now if missing) a folder of this user's closed to others, not a link."""
    with contextlib.suppress(OSError):  # there already (checked next), or cannot be made here (not ours, then)
        os.mkdir(folder, 0o700)
    return _is_private(folder)


def _is_private(folder: Path) -> bool:
    try:
        info = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o077
