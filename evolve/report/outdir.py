"""Files the engine writes for the user: a folder of them (`evolve best --out`, `evolve export`), or one named file
(`evolve report --out` and `--html`, and `evolve init --from`'s problem.toml, through `write_file`).

Why so careful: the names and the text written come from a model's answer or from an archive, and the folder
may lie where others can write (a shared temporary folder, where another user plants links before root runs a
command). So, whatever the caller asks:

- Every name is a plain relative path (evolve.filetree.check_path) with no part starting with '.': nothing is
  ever written to `.git/config`, `.bashrc` or this folder's own record.
- No symbolic link is followed at any level under the folder, the folder itself included. It is opened with
  O_NOFOLLOW, and each subfolder is entered by its name relative to the descriptor of the one above it (openat,
  O_NOFOLLOW), so a link planted at any level, or swapped in while the files are written, is refused with one
  line naming it rather than followed. Only the path up to the folder (the user's own) is taken as it resolves.
- No file the engine did not write is overwritten. A new file is created with O_EXCL. A file already there is
  replaced only when the folder's record, `.evolve-written.json`, says the engine wrote it there with exactly the
  bytes it holds now (an earlier `best --out` or `export` into the same folder): a file the user made, or changed
  since, is refused with one line naming it, and keeps its bytes. The replacement is written beside it under a
  fresh name and renamed over it, so no existing file, not even a hard link to someone else's, is written into.

- No folder is written into that another user made where anyone may write (a folder of theirs in /tmp, or a
  subfolder they made in an OUT anyone may write to): its owner could fill it with links or swap its files later,
  so, as git and ssh refuse what another user owns, it is refused with one line, unless it is ours or root's.
  Another user's folder elsewhere (a shared project folder its owner made writable to us) is written into. The
  record, in a folder anyone may write to, is trusted only when it is ours or root's.

The record maps each path written to the sha256 and size of what was written; it is rewritten (by the same
rename) when the folder is closed, also after a failure, so that the files written before it stay the
engine's own for the next command. A folder opened without a record (`record=False`: problem.toml, written into
a problem folder) only ever gets new files: one already there is refused, whoever wrote it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType

from evolve.filetree import TreeError, check_path

RECORD = ".evolve-written.json"  # its leading dot keeps it apart from every name written (none may have one)
MAX_RECORD_BYTES = 64 << 20
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # NONBLOCK: a planted FIFO cannot hang us
_MOVE_AWAY = "move it away or pass another folder"


class OutputError(Exception):
    """A file cannot be written where asked; `str()` is one line naming it and the way out."""


def check_output_path(path: str) -> str:
    """`path` when it is a plain relative path with no part starting with '.'; OutputError otherwise."""
    try:
        check_path(path)
    except TreeError as exc:
        raise OutputError(str(exc)) from None
    hidden = next((part for part in path.split("/") if part.startswith(".")), None)
    if hidden is not None:
        raise OutputError(f"file path {path!r}: {hidden!r} starts with '.'; evolve writes no hidden file or folder")
    return path


class OutputFolder:
    """The folder at `path` (made if missing), open for `write`; use it as a context manager, which keeps the
    record (unless `record` is False) and closes the folder. Every failure is an OutputError."""

    def __init__(self, path: Path, *, record: bool = True) -> None:
        self.path, self._keeps_record = path, record
        try:
            path.parent.mkdir(parents=True, exist_ok=True)  # the user's own path: taken as it resolves
        except FileExistsError:
            raise OutputError(f"{path.parent} is not a folder; {_MOVE_AWAY}") from None
        except OSError as exc:
            raise OutputError(
                f"{path.parent}: cannot make the folder ({exc.strerror}); pick a writable place"
            ) from None
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            pass  # a folder already there is fine; anything else there is refused when it is opened below
        except OSError as exc:
            raise OutputError(f"{path}: cannot make the folder ({exc.strerror}); pick a writable place") from None
        self._fd = _enter(path, None, path)
        self._changed = False
        try:
            _check_owner(self._fd, _stat_of(Path(os.path.abspath(path)).parent), path)  # "." has a parent too
            self._record = self._read_record() if record else {}
        except BaseException:
            os.close(self._fd)
            raise

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if self._changed and self._keeps_record:
                self._save_record()
        finally:
            os.close(self._fd)

    def write(self, path: str, text: str | Iterable[str]) -> Path:
        """Write `text` (one string, or its pieces in order, as UTF-8) at `path` under the folder; the path."""
        check_output_path(path)
        shown = self.path / path
        parts = path.split("/")
        opened: list[int] = []
        try:
            folder = self._fd
            for depth, part in enumerate(parts[:-1], start=1):
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=folder)
                inside = _enter(part, folder, self.path.joinpath(*parts[:depth]))
                opened.append(inside)
                _check_owner(inside, os.fstat(folder), self.path.joinpath(*parts[:depth]))
                folder = inside
            self._record[path] = self._put(folder, parts[-1], path, shown, [text] if isinstance(text, str) else text)
            self._changed = True
        except OSError as exc:
            raise OutputError(f"{shown}: cannot write it ({exc.strerror}); pick a writable folder") from None
        finally:
            for fd in opened:
                os.close(fd)
        return shown

    def _put(self, folder: int, name: str, path: str, shown: Path, pieces: Iterable[str]) -> dict[str, object]:
        """Create `name` in `folder`, or replace the engine's own unchanged file there; what the record keeps."""
        if not self._is_own(folder, name, path, shown):
            try:
                fd = os.open(name, _NEW, 0o644, dir_fd=folder)
            except FileExistsError:  # made since we looked: another writer's, never ours to replace
                raise OutputError(f"{shown} appeared while evolve was writing it; {_MOVE_AWAY}") from None
            return _fill(fd, pieces, lambda: os.unlink(name, dir_fd=folder), shown)
        temp = f".evolve-{secrets.token_hex(8)}.tmp"
        fd = os.open(temp, _NEW, 0o644, dir_fd=folder)
        written = _fill(fd, pieces, lambda: os.unlink(temp, dir_fd=folder), shown)
        try:
            os.replace(temp, name, src_dir_fd=folder, dst_dir_fd=folder)  # replaces the entry; follows nothing
        except OSError:
            os.unlink(temp, dir_fd=folder)
            raise
        return written

    def _is_own(self, folder: int, name: str, path: str, shown: Path) -> bool:
        """False when nothing is at `name`; True when the engine's own file, unchanged, is; OutputError else."""
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISLNK(st.st_mode):
            raise OutputError(
                f"{shown} is a symbolic link; evolve writes through none: remove it or pass another folder"
            )
        if not stat.S_ISREG(st.st_mode):
            raise OutputError(f"{shown} exists and is not a file; {_MOVE_AWAY}")
        kept = self._record.get(path)
        if kept is None or kept.get("bytes") != st.st_size or _digest(folder, name) != kept.get("sha256"):
            raise OutputError(f"{shown} exists and evolve did not write it (or it was changed since); {_MOVE_AWAY}")
        return True

    def _read_record(self) -> dict[str, dict[str, object]]:
        shown = self.path / RECORD
        try:
            fd = os.open(RECORD, _READ, dir_fd=self._fd)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            what = "is a symbolic link" if exc.errno == errno.ELOOP else f"cannot be read ({exc.strerror})"
            raise OutputError(f"{shown} {what}; {_MOVE_AWAY}") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_RECORD_BYTES:
                raise OutputError(f"{shown} is not a record evolve wrote; {_MOVE_AWAY}")
            _check_owner(f.fileno(), os.fstat(self._fd), shown)
            raw = f.read()
        try:
            files = json.loads(raw)["files"]
            if not all(isinstance(k, str) and isinstance(v, dict) for k, v in files.items()):
                raise ValueError("not a map of paths")
        except (ValueError, KeyError, TypeError, AttributeError):
            raise OutputError(f"{shown} is not a record evolve wrote; {_MOVE_AWAY}") from None
        return files

    def _save_record(self) -> None:
        body = json.dumps({"written_by": "evolve", "files": dict(sorted(self._record.items()))}, indent=1)
        temp = f".evolve-{secrets.token_hex(8)}.tmp"
        fd = os.open(temp, _NEW, 0o644, dir_fd=self._fd)
        _fill(fd, [body + "\n"], lambda: os.unlink(temp, dir_fd=self._fd), self.path / RECORD)
        try:
            os.replace(temp, RECORD, src_dir_fd=self._fd, dst_dir_fd=self._fd)
        except OSError as exc:
            os.unlink(temp, dir_fd=self._fd)
            raise OutputError(f"{self.path / RECORD}: cannot write it ({exc.strerror})") from None


def write_file(path: Path, text: str | Iterable[str], *, record: bool = True) -> Path:
    """Write the one file `path` as `OutputFolder` writes (its folder, which must exist: the user names a file,
    not a place to make, is the output folder); the path. `record`: keep the folder's record, so that the next
    command may replace this file while it holds what evolve wrote; without one, only a new file is written."""
    if not path.name or path.name in (".", ".."):
        raise OutputError(f"{path}: name a file to write, not a folder")
    if not path.parent.is_dir():
        raise OutputError(f"{path.parent}: no such folder; make it first, or name a file in another one")
    with OutputFolder(path.parent, record=record) as folder:
        return folder.write(path.name, text)


def _stat_of(folder: Path) -> os.stat_result:
    """The folder holding the output folder, as it resolves (the user's own path)."""
    try:
        return os.stat(folder)
    except OSError as exc:
        raise OutputError(f"{folder}: cannot read the folder ({exc.strerror}); pick a readable place") from None


def _check_owner(fd: int, container: os.stat_result, shown: Path) -> None:
    """OutputError when `fd` (a folder, or the record) belongs to another user than us and root, and lies in a
    folder (`container`) anyone may write to: its owner made it there, and can change it under us."""
    owner = os.fstat(fd).st_uid
    if owner in (os.geteuid(), 0) or not container.st_mode & stat.S_IWOTH:
        return
    raise OutputError(
        f"{shown} belongs to another user (uid {owner}) in a folder anyone may write to; evolve writes into no "
        "such place: remove it, or pass a folder of your own"
    )


def _enter(name: str | Path, folder: int | None, shown: Path) -> int:
    """A descriptor of the folder `name` (relative to the folder `folder`), refusing a link or anything else."""
    try:
        return os.open(name, _DIR, dir_fd=folder)
    except OSError as exc:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise OutputError(f"{shown}: cannot open the folder ({exc.strerror}); pick a writable place") from None
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        if link:
            raise OutputError(
                f"{shown} is a symbolic link; evolve follows none where it writes: remove it or pass a real folder"
            ) from None
        raise OutputError(f"{shown} is not a folder; {_MOVE_AWAY}") from None


def _fill(fd: int, pieces: Iterable[str], undo: Callable[[], None], shown: Path) -> dict[str, object]:
    """Write `pieces` as UTF-8 into the new file `fd`; its sha256 and size. On any failure the file is removed
    (`undo`) before the error goes on: no half-written file is left behind under the engine's name."""
    digest, size = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                data = piece.encode("utf-8")
                digest.update(data)
                size += len(data)
                f.write(data)
    except BaseException as exc:
        undo()
        if isinstance(exc, UnicodeEncodeError):
            raise OutputError(f"{shown}: the text holds a character UTF-8 cannot (a lone surrogate)") from None
        raise
    return {"sha256": digest.hexdigest(), "bytes": size}


def _digest(folder: int, name: str) -> str | None:
    """The sha256 of the regular file `name` in `folder`, read without following a link; None if it is none."""
    try:
        fd = os.open(name, _READ, dir_fd=folder)
    except OSError:
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()
