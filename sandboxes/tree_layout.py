"""Lay a program's files out in a fresh work folder (the process sandbox; the Docker runner does the same)."""

from __future__ import annotations

import os
from collections.abc import Mapping


def lay_out(workdir: str, files: Mapping[str, str], uid: int | None = None) -> None:
    """Write each file at its relative path under `workdir`, making its folders, then give the whole folder to
    `uid` (when the candidate runs as another user) and close it to everyone else. Every path is checked again
    (relative, no `..`: the full rules of evolve/filetree.py were applied when a program of several files was
    split), and nothing is followed or overwritten: the folder is new, so a path that exists already, or a
    symlink on the way, fails the write rather than land elsewhere."""
    for path, text in files.items():
        parts = path.split("/")
        if path.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"{path!r}: a program's file must stay inside its work folder")
        folder = workdir
        for part in parts[:-1]:
            folder = os.path.join(folder, part)
            if not os.path.isdir(folder) or os.path.islink(folder):
                os.mkdir(folder, 0o755)
        target = os.path.join(folder, parts[-1])
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with open(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    if uid is not None:
        for folder, dirs, names in os.walk(workdir):
            for name in dirs + names:
                os.chown(os.path.join(folder, name), uid, uid, follow_symlinks=False)
        os.chown(workdir, uid, uid)
    os.chmod(workdir, 0o700)
