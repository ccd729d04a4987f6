"""A variant's edits to a program of several files (evolve/filetree.py).

A variant names the file each part of it changes with the same header line the prompt shows, then gives that
file's SEARCH/REPLACE edits or its blocks' new code:

    === FILE: lib/params.py ===
    <<<<<<< SEARCH
    ...

A variant that names no file is applied to the program's joined text as a whole, as a variant of a one-file
program is (an edit's SEARCH text is then found in whichever file holds it; fenced blocks replace the blocks of
all files in order). A file named that is not in the program, or a path that leaves it, makes the variant
`parse_error`; a file named that has no EVOLVE blocks makes it `outside_block` (unless the variant only copies
it unchanged, as small models do with every file shown: that part is skipped): nothing is ever written
anywhere but into the blocks of the program's own files.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence

from evolve.filetree import TreeError, check_path, join_files, split_files, tree_files
from evolve.problem.blocks import BlockError, find_blocks, has_markers
from evolve.prompts.block_match import defined_names
from evolve.prompts.edit_scan import find_edits
from evolve.prompts.parse_limits import UNLIMITED, Deadline

_ANY_FENCE = re.compile(r"```(?:[ \t]*[\w+#.-]+)?[ \t]*\n(.*?)(?:```|\Z)", re.S)

# The header, as the prompt shows it; tolerant of the decorations small models add (###, **, `, //, a missing
# colon or closing ===). Linear: it starts only at a line start, and no two of its quantifiers can take the same
# run of characters (the path takes no space, `=`, `*` or backtick; the optional `===` needs its `=`).
_NAMED = re.compile(r"^[ \t>*#/`]*={2,4}[ \t]*FILE:?[ \t]*([^\s=`*]+)(?:[ \t]*={2,4})?[ \t*`]*$", re.M | re.I)

Result = tuple[str | None, str, str | None]  # (child code or None, status, detail)


def named_sections(body: str) -> list[tuple[str | None, str]]:
    """(file path or None for text before the first header, that part of the variant), in order."""
    heads = list(_NAMED.finditer(body))
    if not heads:
        return [(None, body)]
    out: list[tuple[str | None, str]] = [(None, body[: heads[0].start()])]
    for head, nxt in zip(heads, [*heads[1:], None], strict=True):
        out.append((head.group(1), body[head.end() : len(body) if nxt is None else nxt.start()]))
    return out


def path_lines_as_headers(body: str, paths: Sequence[str]) -> str:
    """Small models name a file by its path alone: on a line of its own (`lib/params.py`, `**lib/params.py:**`)
    or as the first line inside its fence, where Python would read it as `lib / params.py`. Such a line, naming
    a file of the program, is read as that file's header (put before the fence it opened); a path further inside
    a fence is code (a comment) and stays."""
    if not paths:
        return body
    known = set(paths)
    out: list[str] = []
    fenced, opener = False, -1
    for line in body.split("\n"):
        if line.lstrip().startswith("```"):
            fenced, opener = not fenced, len(out)
            out.append(line)
            continue
        found = _named_path(line, known)
        if found is None or (fenced and opener != len(out) - 1):
            out.append(line)
        elif fenced:  # the fence's first line: the header goes before the fence
            out.insert(opener, f"=== FILE: {found} ===")
        else:
            out.append(f"=== FILE: {found} ===")
    return "\n".join(out)


def _named_path(line: str, paths: set[str]) -> str | None:
    """The path `line` names by itself, decorated or not (`**lib/params.py:**`), or None. Stripping is exact: a
    path's characters (filetree.check_path) are none of the decorations. A regex of every path as alternatives
    tried them all at each space of a long indentation (the paths times the spaces)."""
    name = line.lstrip(" \t>*#/`").rstrip(" \t*`:")
    return name if name in paths else None


def edit_tree(parent: str, body: str, deadline: Deadline = UNLIMITED) -> Result:
    """The child of a program of several files that one variant's text makes (see the module docstring)."""
    from evolve.prompts.parser import _apply_edits, _full_rewrite  # the one-text rules, per file

    sections = named_sections(path_lines_as_headers(body, [path for path, _ in split_files(parent)]))
    deadline.check()
    if len(sections) == 1:  # no file named: the joined text is edited as one program
        edits = find_edits(body)
        return _apply_edits(parent, edits, deadline) if edits else _full_rewrite(parent, body, deadline)
    files = dict(split_files(parent))
    preamble = find_edits(sections[0][1])
    code = parent
    if preamble:  # edits before the first header: found wherever they apply
        code, status, detail = _apply_edits(parent, preamble, deadline)
        if code is None:
            return code, status, detail
        files = dict(split_files(code))
    for path, text in sections[1:]:
        deadline.check()  # each file's part costs that file's length: thousands of headers are checked one by one
        assert path is not None
        try:
            check_path(path)
        except TreeError as exc:
            return None, "parse_error", f"an edit names a path outside the program: {exc}"
        if path not in files:
            return None, "parse_error", f"an edit names {path!r}, which is not a file of the program"
        edits = find_edits(text)
        if not edits and not _echoes(files[path], text):
            path = _owner_by_names(path, text, files)
        if not has_markers(files[path]):
            if _echoes(files[path], text):  # small models copy every file shown: an unchanged copy is no edit
                continue
            return None, "outside_block", f"{path} has no EVOLVE blocks: it cannot change"
        new, status, detail = (
            _apply_edits(files[path], edits, deadline) if edits else _full_rewrite(files[path], text, deadline)
        )
        if new is None:
            return None, status, f"{path}: {detail}"
        files[path] = new
    try:
        return join_files(list(files.items())), "ok", None
    except TreeError as exc:
        return None, "bad_blocks", str(exc)


def _owner_by_names(path: str, section: str, files: Mapping[str, str]) -> str:
    """The file whose block a section's new code replaces: the file its header names, unless the code defines
    names of no block there and of blocks of exactly one other file (small models put `def order` under the
    header of lib/params.py; written into params' one block, it broke both files)."""
    defined = defined_names("\n".join(_ANY_FENCE.findall(section)) or section)
    if not defined or defined & _block_names(files[path]):
        return path
    others = [other for other, text in files.items() if other != path and defined & _block_names(text)]
    return others[0] if len(others) == 1 else path


def _block_names(text: str) -> set[str]:
    """The names that a file's EVOLVE blocks define."""
    try:
        return set().union(*(defined_names(block.text) for block in find_blocks(text)))
    except BlockError:
        return set()


def _echoes(text: str, section: str) -> bool:
    """True when a variant's part for a file is that file's own text again (in a fence or not), unchanged."""
    fences = _ANY_FENCE.findall(section)
    shown = fences[0] if len(fences) == 1 else section
    return shown.strip() == text.strip()


def tree_changes(parent: str, child: str) -> str | None:
    """Why `child` does not keep `parent`'s files (a file added, dropped, renamed, or a path that leaves the
    program), or None. A block body holding a header line would otherwise split into a new file."""
    mine, theirs = tree_files(child), tree_files(parent)
    if mine is None or theirs is None:
        return "the program's file headers are broken (a header line inside a block, or a bad path)"
    if [p for p, _ in mine] != [p for p, _ in theirs]:
        return "the variant adds, drops or renames a file; only the blocks of the program's files may change"
    return None


def tree_syntax_error(code: str) -> str | None:
    """The first Python syntax error among the program's .py files, naming the file; None when they parse."""
    for path, text in tree_files(code) or ():
        if path.endswith(".py"):
            try:
                ast.parse(text)
            except SyntaxError as exc:
                return f"{path} line {exc.lineno}: {exc.msg}"
    return None
