"""Files read from a problem folder, and the seed of a program of several files (`[program] files`).

A problem folder is untrusted input: whatever it names is read on this machine and may end up in a prompt sent to
a policy server. So every file the engine reads from it goes through here: `folder_file` keeps a path relative,
plain and inside the folder (no `..`, no absolute path, no symlink pointing out; the same rule for `[program]
file`, `[program] files`, `[evaluator] file`, `data/` and the files read by their fixed names), and `read_text`
turns bytes that are not UTF-8 into one line naming the file and the byte offset.

Every refusal is a one-line `ProblemError` naming the file and the fix: a path that leaves the folder, a file that
is not UTF-8 text, too many files or bytes, a header line inside a file, or no EVOLVE block in any file (a program
of several files is edited through its blocks only; a file without markers is fixed, not editable as a whole).
"""

from __future__ import annotations

from pathlib import Path

from evolve.filetree import MAX_FILES, TreeError, check_path, join_files
from evolve.problem.blocks import BlockError, find_blocks, has_markers
from evolve.problem.errors import ProblemError

SKIPPED_DIRS = {"__pycache__", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
# What the engine reads from a folder by name, besides the files its problem.toml names: a link pointing out of
# the folder would put a host file (or, for data/, a host folder shown to every candidate) in its place.
FIXED_NAMES = ("problem.toml", "data", "Dockerfile")


def inside(root: Path, path: Path, shown: str) -> Path:
    """`path` resolved, refused when it (or a symlink on its way) leads out of the problem folder `root`."""
    resolved = path.resolve()
    if not resolved.is_relative_to(root):
        raise ProblemError(f"{root / shown}: leads outside the problem folder (a symlink?); copy the file in instead")
    return resolved


def folder_path(name: str) -> str:
    """`name` if it is a plain relative path that stays inside the folder (the rule of `[program] files`);
    ValueError otherwise, saying so (for the problem.toml schema, which has no folder to resolve against)."""
    try:
        return check_path(name)
    except TreeError as exc:
        raise ValueError(f"{exc}; name a file inside the problem folder") from None


def folder_file(root: Path, name: str, where: str) -> Path:
    """The file `name` (what `where`, a setting such as "[program] file", says) in the problem folder `root`,
    checked as `folder_path` does and resolved inside `root`; it may not exist."""
    try:
        folder_path(name)
    except ValueError as exc:
        raise ProblemError(f"{root / 'problem.toml'}: {where}: {exc}") from None
    return inside(root, root / name, name)


def check_fixed_names(root: Path, names: tuple[str, ...] = FIXED_NAMES) -> None:
    """Refuse any of `names` in `root` that is a symlink leading out of it."""
    for name in names:
        path = root / name
        if path.is_symlink() or path.exists():
            inside(root, path, name)


def read_text(path: Path, fix: str = "save it as UTF-8 text") -> str:
    """The UTF-8 text of `path`; a one-line ProblemError (`fix` says what to do) when it cannot be read or is not
    UTF-8, naming the byte offset of the first byte that is not: the place to look in a hex editor."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ProblemError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__}); {fix}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = data[exc.start]
        raise ProblemError(f"{path}: not UTF-8 text (byte 0x{bad:02x} at byte offset {exc.start}); {fix}") from None


def _expand(root: Path, entry: str) -> list[str]:
    """The program paths an entry of `[program] files` names: the file itself, or every file under a folder."""
    rel = entry.removesuffix("/")
    path = inside(root, root / rel, rel)
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
            inside(root, sub, f"{rel}/{'/'.join(parts)}")
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
        except TreeError as exc:
            raise ProblemError(f"{root}: {exc}; rename it or leave it out of [program] files") from None  # exc: repr
        text = read_text(root / rel, "save it as UTF-8 text or leave it out of [program] files")
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
