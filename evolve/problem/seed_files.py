"""The seed of a program of several files: `[program] files` read from the problem folder into one text.

Every refusal is a one-line `ProblemError` naming the file and the fix: a path that leaves the folder (`..`, an
absolute path, a symlink pointing out), a file that is not UTF-8 text, too many files or bytes, a header line
inside a file, or no EVOLVE block in any file (a program of several files is edited through its blocks only;
a file without markers is fixed, not editable as a whole).
"""

from __future__ import annotations

from pathlib import Path

from evolve.filetree import MAX_FILES, TreeError, check_path, join_files
from evolve.problem.blocks import BlockError, find_blocks, has_markers
from evolve.problem.errors import ProblemError

SKIPPED_DIRS = {"__pycache__", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache"}


def _inside(root: Path, path: Path, shown: str) -> Path:
    """`path` resolved, refused when it (or a symlink on its way) leads out of the problem folder."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise ProblemError(f"{root / shown}: leads outside the problem folder (a symlink?); copy the file in instead")
    return resolved


def _expand(root: Path, entry: str) -> list[str]:
    """The program paths an entry of `[program] files` names: the file itself, or every file under a folder."""
    rel = entry.removesuffix("/")
    path = _inside(root, root / rel, rel)
    if path.is_file() and not entry.endswith("/"):
        return [rel]
    if not path.is_dir():
        raise ProblemError(f"{root / rel}: [program] files names it but it is missing; create it or fix the list")
    found = []
    for sub in sorted(path.rglob("*")):
        parts = sub.relative_to(path).parts
        if any(p in SKIPPED_DIRS or p.startswith(".") for p in parts) or sub.suffix == ".pyc":
            continue
        if sub.is_symlink():
            _inside(root, sub, f"{rel}/{'/'.join(parts)}")
        if sub.is_file():
            found.append(f"{rel}/{'/'.join(parts)}")
        if len(found) > MAX_FILES:
            break
    return found


def read_seed_files(root: Path, entries: list[str], entry_file: str) -> tuple[tuple[str, ...], str]:
    """(the program's paths, its joined text) for `[program] files`; ProblemError on anything out of line."""
    toml = root / "problem.toml"
    paths: list[str] = []
    for entry in entries:
        paths += [p for p in _expand(root, entry) if p not in paths]
    if entry_file not in paths:
        raise ProblemError(f"{toml}: [program] file {entry_file!r} is not among [program] files; list it there")
    files = []
    for rel in paths:
        try:
            check_path(rel)
            text = (root / rel).read_bytes().decode("utf-8")
        except TreeError as exc:
            raise ProblemError(f"{root}: {exc}; rename it or leave it out of [program] files") from None  # exc: repr
        except UnicodeDecodeError:
            raise ProblemError(f"{root / rel}: not UTF-8 text; leave it out of [program] files") from None
        try:
            find_blocks(text)
        except BlockError as exc:
            raise ProblemError(f"{root / rel}: {exc}; balance the EVOLVE-BLOCK markers") from None
        files.append((rel, text))
    try:
        joined = join_files(files)
    except TreeError as exc:
        raise ProblemError(f"{toml}: [program] files: {exc}") from None
    if not has_markers(joined):
        raise ProblemError(
            f"{toml}: no EVOLVE-BLOCK-START in any of [program] files; mark what the model may change "
            "(a program of several files is edited through its blocks only)"
        )
    return tuple(paths), joined
