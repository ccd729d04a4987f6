"""A program of several files, carried through the engine as one text.

Why one text: everything between the problem folder and the sandbox (the parser, the prompt, the code hash, the
duplicate index, the loop's records) already works on one string per program. A program of several files is
that string in a fixed form, each file under a header line:

    === FILE: solver.py ===
    ...its text...
    === FILE: lib/params.py ===
    ...its text...

The headers lie outside every EVOLVE block, so the block rules that keep a child's frame keep its file list
too; the archive stores the files as content-addressed blobs, and the sandboxes lay them out as a tree. Every
path is relative and stays inside the program. Nothing here writes files.

A text is a program of several files only where its problem says so (`[program] files`, `Problem.multi_file`),
and never because of what it holds: on a problem of one file, a text that starts with a header line is still one
file, named as the seed (a shell problem even runs and scores it, so a model can write one). So nothing here tells
the two apart from the text: every reader that treats a program as files (the parser, the prompt, the code hash,
the archive's storage, the per-file diff, the sandboxes' work folder, the files written for the user) is handed
the problem's layout as a value and splits only when it says several files. Stdlib only: the archive, the problem
model, the prompts and the sandboxes all read it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

HEADER_PREFIX = "=== FILE: "
_HEADER = re.compile(r"^=== FILE: (.*) ===$", re.M)
MAX_FILES = 200  # files in one program
MAX_BYTES = 4 << 20  # UTF-8 bytes of all its files together
# A path part: letters, digits and . _ + - only (no spaces, quotes, backslashes or control characters), and
# never one the sandbox writes beside the program (its harness and evaluator are named _evolve_*).
_PART = re.compile(r"^[A-Za-z0-9_+.-]{1,100}$")


class TreeError(ValueError):
    """A program's files break a rule; `str()` is one line naming what and how to fix it."""


def check_path(path: str) -> str:
    """`path` if it is relative, stays inside the program and is made of plain parts; TreeError otherwise."""
    if not path or path.startswith("/") or "\\" in path:
        raise TreeError(f"file path {path!r} must be relative, with / between parts (e.g. lib/params.py)")
    parts = path.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            raise TreeError(f"file path {path!r} must stay inside the program: no '..', '.' or empty parts")
        if not _PART.fullmatch(part):  # not match: its $ also passes a part ending in a newline
            raise TreeError(f"file path {path!r}: use letters, digits and . _ + - only in each part")
    if parts[0].startswith("_evolve"):
        raise TreeError(f"file path {path!r}: names starting with _evolve are the sandbox's own")
    return path


def check_files(files: Sequence[tuple[str, str]]) -> None:
    """The rules every program of several files keeps: valid distinct paths (no file also a folder), at most
    MAX_FILES files and MAX_BYTES bytes, and no header line inside a file (it would split it in two)."""
    if not files:
        raise TreeError("a program of several files needs at least one file")
    if len(files) > MAX_FILES:
        raise TreeError(f"{len(files)} files; at most {MAX_FILES} per program")
    seen: set[str] = set()
    total = 0
    for path, text in files:
        check_path(path)
        if path in seen:
            raise TreeError(f"file path {path!r} appears twice")
        seen.add(path)
        total += len(text.encode("utf-8", "surrogatepass"))
        if _HEADER.search(text):
            raise TreeError(f"{path}: a line of it starts with {HEADER_PREFIX!r}, which separates files; change it")
    folders = {"/".join(p.split("/")[:i]) for p in seen for i in range(1, p.count("/") + 1)}
    clash = sorted(seen & folders)
    if clash:
        raise TreeError(f"{clash[0]!r} is both a file and a folder")
    if total > MAX_BYTES:
        raise TreeError(f"the program's files hold {total} bytes; at most {MAX_BYTES}")


def layout_allows(path: str, entries: Sequence[str]) -> bool:
    """True when a problem whose `[program] files` are `entries` can have a file at `path`: an entry naming a
    file, or a file under an entry naming a folder ("lib/", or "lib" when it is one). Never a path with a part
    starting with '.': reading a folder entry skips those (evolve/problem/seed_files.py), so no program of the
    problem has one, and a `.git/config` could only come from a model's text or a damaged archive."""
    if any(part.startswith(".") for part in path.split("/")):
        return False
    return any(path == e or path.startswith(e.removesuffix("/") + "/") for e in entries)


def check_layout(paths: Sequence[str], entries: Sequence[str]) -> None:
    """TreeError, naming the first of `paths` that `layout_allows` refuses, or that breaks `check_path`."""
    for path in paths:
        check_path(path)
        if not layout_allows(path, entries):
            hidden = any(part.startswith(".") for part in path.split("/"))
            why = "a part starting with '.' is never a program's" if hidden else "it is not among them"
            raise TreeError(f"file path {path!r}: the problem's [program] files are {list(entries)}, and {why}")


def join_files(files: Sequence[tuple[str, str]]) -> str:
    """The one text of `files` (path, text) in order; a text that does not end with a newline gets one."""
    check_files(files)
    out = []
    for path, text in files:
        out.append(f"{HEADER_PREFIX}{path} ===\n")
        out.append(text if not text or text.endswith("\n") else text + "\n")
    return "".join(out)


def split_files(text: str) -> list[tuple[str, str]]:
    """(path, text) of each file of a joined program, in order; TreeError when it is not one or breaks a rule."""
    heads = list(_HEADER.finditer(text))
    if not heads or heads[0].start() != 0:
        raise TreeError(f"a program of several files starts with a {HEADER_PREFIX!r}<path> === line")
    if heads[-1].end() == len(text):  # split, it would store (and read back) a newline it never had
        raise TreeError(f"the last header line {heads[-1].group(0)!r} must end with a newline")
    files = []
    for head, nxt in zip(heads, [*heads[1:], None], strict=True):
        end = len(text) if nxt is None else nxt.start()
        files.append((head.group(1), text[head.end() + 1 : end]))
    check_files(files)
    return files


def tree_files(text: str) -> list[tuple[str, str]] | None:
    """The files of a joined program text, or None when it does not split by the rules (a damaged archive, or a
    block body that grew a header line). For a program of a problem of several files only: a one-file program is
    one text whatever it holds, and its callers never split it (see the module docstring)."""
    try:
        return split_files(text)
    except TreeError:
        return None


def file_spans(text: str) -> list[tuple[str, int, int]]:
    """(path, start, end) of each file's text within a joined program: where its blocks lie."""
    heads = list(_HEADER.finditer(text))
    return [
        (head.group(1), head.end() + 1, len(text) if nxt is None else nxt.start())
        for head, nxt in zip(heads, [*heads[1:], None], strict=True)
    ]


def program_diff(parent: str, child: str, parent_label: str, child_label: str, multi_file: bool) -> list[str]:
    """A unified diff of two programs; on a problem of several files (`multi_file`) one diff per changed file,
    each headed by the file's path, so a change spanning files reads as it would in a repository."""
    whole = difflib.unified_diff(parent.splitlines(), child.splitlines(), parent_label, child_label, lineterm="")
    if not multi_file:
        return list(whole)
    old_files, new_files = tree_files(parent), tree_files(child)
    if old_files is None or new_files is None:
        return list(whole)
    before, after = dict(old_files), dict(new_files)
    out: list[str] = []
    for path in [*before, *(p for p in after if p not in before)]:
        old, new = before.get(path, ""), after.get(path, "")
        if old != new:
            out += difflib.unified_diff(
                old.splitlines(), new.splitlines(), f"{parent_label}/{path}", f"{child_label}/{path}", lineterm=""
            )
    return out
