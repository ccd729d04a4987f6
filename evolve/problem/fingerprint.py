"""A problem folder's fingerprint: every file that can decide a score, hashed by its content, one hash per file.

Why every file and not problem.toml and the evaluator alone: the evaluator imports modules beside it and reads
data files, the sandbox shows candidates `data/`, a Dockerfile makes the image they run in, and the seed is the
run's first program. A run resumed after any of them changed would hold two scorings in one archive, and its
best would be reported under an evaluator no longer in force. So the whole folder is hashed, by content (sha256:
an mtime moves on a copy and can stay put across an edit), and a run keeps one hash per file (path -> hash), so
that a refused resume names the files that changed.

Left out, because the engine or Python writes them there (an archive kept in the folder must not change its own
fingerprint by being written to):
- folders named `__pycache__`, `.git` or a tool's cache (`SKIPPED_DIRS`), anywhere, `*.pyc` files, and `runs/` at
  the top (the default archive's folder when `evolve run .` is started in the problem folder);
- outside `data/`: SQLite files (an archive given by `--db` inside the folder), their `-wal`, `-shm` and `-journal`
  companions, the session locks beside them (`ARCHIVE-PROBLEM-HASH.lock`) and their adapters' folder
  (`ARCHIVE.adapters`). Under `data/` every file counts: a candidate may read a SQLite file there.

`problem.toml` is compared by its parsed content, so a comment or a reformatted table, which cannot change a
score, does not stop a resume; every other file by its bytes (code can read its own comments). A FIFO, a socket, a
device or a file that cannot be read is recorded by its kind and never read (reading a FIFO would block); a
symbolic link by where it points and, when that is a regular file, by its content too. A regular file's hash is
its plain sha256, the one `sha256sum` prints.

Cost: one read of every file, once per session (`Problem.file_hashes` is cached). On a busy 2-core machine: at most
15 ms for each shipped problem, 0.3-0.5 s for 100 MB of data, 1.3 s for 10,000 small files (docs/problem-format.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.problem.seed_files import SKIPPED_DIRS

INFERRED = "(settings inferred for the OpenEvolve folder)"  # the entry of a folder without problem.toml
SQLITE_MAGIC = b"SQLite format 3\x00"
COMPANIONS = ("-wal", "-shm", "-journal")
SESSION_LOCK = re.compile(r"-[0-9a-f]{12}\.lock$")  # evolve/archive/session_lock.py: ARCHIVE-PROBLEM-HASH.lock
CHUNK = 1 << 20
SHOWN = 5  # the names a refusal lists of each kind before "and N more"


def folder_hashes(root: Path, settings: Mapping[str, Any] | None = None) -> dict[str, str]:
    """path (relative, `/`-separated) -> hash, for every file of the folder `root` that can decide a score.

    `settings`: the problem's config, which stands for problem.toml in a folder without one (an OpenEvolve folder,
    whose settings are inferred)."""
    hashes: dict[str, str] = {}
    _walk(root, hashes)
    if "problem.toml" in hashes:
        hashes["problem.toml"] = _toml_hash(root / "problem.toml") or hashes["problem.toml"]
    elif settings is not None:
        hashes[INFERRED] = hashlib.sha256(_canonical(settings)).hexdigest()
    return hashes


def combined(hashes: Mapping[str, str]) -> str:
    """One short hash of a folder's per-file hashes: the run's `problem_fingerprint` (and the Ray pool's key)."""
    h = hashlib.sha256()
    for path in sorted(hashes):
        h.update(f"{path}\0{hashes[path]}\n".encode("utf-8", "backslashreplace"))
    return h.hexdigest()[:16]


def legacy_fingerprint(root: Path, evaluator: Path, settings_json: str) -> str:
    """The fingerprint archives stored before per-file hashes: problem.toml's bytes (a folder without one: its
    inferred config as JSON) and the evaluator's, nothing else. Kept to resume those archives as they were checked."""
    h = hashlib.sha256()
    toml = root / "problem.toml"
    h.update(toml.read_bytes() if toml.is_file() else settings_json.encode())
    h.update(evaluator.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Changes:
    """How a folder's files differ from the hashes a run stored: paths changed, added and removed, each sorted."""

    changed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.changed or self.added or self.removed)

    @property
    def count(self) -> int:
        return len(self.changed) + len(self.added) + len(self.removed)

    def describe(self) -> str:
        """One line: `data/params.json and hidden.py changed, notes.txt added`."""
        parts = [(self.changed, "changed"), (self.added, "added"), (self.removed, "removed")]
        return ", ".join(f"{_names(paths)} {what}" for paths, what in parts if paths)


def changes(stored: Mapping[str, str], now: Mapping[str, str]) -> Changes:
    """What differs between the hashes a run stored and the folder's hashes now."""
    return Changes(
        changed=tuple(sorted(p for p in stored.keys() & now.keys() if stored[p] != now[p])),
        added=tuple(sorted(now.keys() - stored.keys())),
        removed=tuple(sorted(stored.keys() - now.keys())),
    )


def is_file_hashes(value: object) -> bool:
    """Whether a stored value reads as per-file hashes (a map of text to text), as `folder_hashes` makes them."""
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _names(paths: tuple[str, ...]) -> str:
    shown = [p if p.isprintable() else ascii(p) for p in paths[:SHOWN]]
    if len(paths) > SHOWN:
        return f"{', '.join(shown)} and {len(paths) - SHOWN} more"
    return shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} and {shown[-1]}"


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=True).encode()


def _toml_hash(path: Path) -> str | None:
    """problem.toml by its parsed content (comments, spacing and key order make no difference); None when it does
    not parse (then its bytes count: the loader refuses it anyway)."""
    try:
        return hashlib.sha256(b"toml\0" + _canonical(tomllib.loads(path.read_text("utf-8")))).hexdigest()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return None


def _shown(name: str) -> str:
    """A file name as JSON and every database can store it: bytes that are not UTF-8 as backslash escapes."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _walk(root: Path, out: dict[str, str]) -> None:
    """Every file under `root` into `out`, folder by folder from a list of those left to read (no recursion: a folder
    nested a thousand deep is no RecursionError); a link to a folder is not entered (no loop)."""
    pending: list[tuple[str, ...]] = [()]
    while pending:
        parts = pending.pop()
        try:
            with os.scandir(root.joinpath(*parts)) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            out["/".join(map(_shown, parts)) + "/"] = f"unreadable folder ({exc.strerror})"
            continue
        left_out = set() if parts[:1] == ("data",) else _engine_outputs(entries)
        for entry in entries:
            here = (*parts, entry.name)
            if entry.name in left_out or entry.name in SKIPPED_DIRS or entry.name.endswith(".pyc") or here == ("runs",):
                continue
            if entry.is_dir(follow_symlinks=False):
                pending.append(here)
            else:
                out["/".join(map(_shown, here))] = _entry_hash(entry.path)


def _engine_outputs(entries: list[os.DirEntry[str]]) -> set[str]:
    """The names in one folder (not under data/) that an archive kept there brings: the SQLite files, their
    companions, their session locks and their adapters' folders."""
    archives = [e.name for e in entries if _is_sqlite(e)]
    names = set(archives)
    for archive in archives:
        names.update(archive + suffix for suffix in COMPANIONS)
        names.add(Path(archive).with_suffix(".adapters").name)  # evolve.search.adapters_next_to
        names.update(e.name for e in entries if e.name.startswith(archive + "-") and SESSION_LOCK.search(e.name))
    return names


def _is_sqlite(entry: os.DirEntry[str]) -> bool:
    try:
        if not entry.is_file(follow_symlinks=False):
            return False
        fd = os.open(entry.path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


def _entry_hash(path: str) -> str:
    """A regular file's sha256; a link's target (and its file's sha256); the kind of anything else, never read."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    link = ""
    if stat.S_ISLNK(st.st_mode):
        try:
            link = f"link to {_shown(os.readlink(path))}"
            st = os.stat(path)
        except OSError:
            return link or "unreadable link"
    if not stat.S_ISREG(st.st_mode):
        return " ".join(filter(None, [link, _kind(st.st_mode)]))
    content = _file_sha256(path)
    return f"{link}: {content}" if link else content


def _kind(mode: int) -> str:
    kinds = [(stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "fifo"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "device")]
    return next((name for test, name in kinds if test(mode)), "device")


def _file_sha256(path: str) -> str:
    h = hashlib.sha256()
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # NONBLOCK: a FIFO swapped in cannot hang us
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return "not a regular file"
        try:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        except OSError as exc:
            return f"unreadable ({exc.strerror})"
    return h.hexdigest()
