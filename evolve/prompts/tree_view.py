"""How a prompt shows a program of several files, and how it tells the model to name the file it edits.

The current program's files that hold EVOLVE blocks are shown whole (the model needs the code around a block
to change it well), each under the header line it must repeat to edit it; files without blocks are context
only and go first when the text would pass the budget, then the block files shrink to their blocks. Other
programs (inspirations, recent children) show only their blocks, each labelled with its file.
"""

from __future__ import annotations

from evolve.filetree import file_spans, tree_files
from evolve.problem.blocks import BlockError, find_blocks, has_markers

PROGRAM_CHARS = 9000  # the current program's files shown whole, at most (about 3k tokens)


def _fenced(path: str, text: str, tag: str) -> str:
    return f"=== FILE: {path} ===\n```{tag}\n{text.rstrip()}\n```"


def current_program(code: str, tag: str, budget: int = PROGRAM_CHARS, view: str = "files") -> str:
    """The current program's files within `budget` characters: those without blocks first, as context, while they
    fit (one left out is named in one line, so the model knows it exists), then those with blocks, whole. Why
    this order: a small model rewrites the last code it read; shown last, a fixed file drew every answer of a
    0.5B model (its `solve`, which cannot change, rewritten 10 times of 12). View "blocks": the blocks only,
    each under its file's header, and the fixed files named (shown first, the same model still rewrote them)."""
    files = tree_files(code) or []
    editable = [_fenced(p, t, tag) for p, t in files if has_markers(t)]
    if view == "blocks" or sum(map(len, editable)) > budget:  # the blocks only (or the files are too long)
        editable = [f"=== FILE: {p} ===\n{_file_blocks(t, tag)}" for p, t in files if has_markers(t)]
    if view == "blocks":
        budget = 0  # every fixed file is named, none shown
    used = sum(map(len, editable))
    context, left_out = [], []
    for path, text in files:
        if has_markers(text):
            continue
        part = _fenced(path, text, tag) + "\n(no EVOLVE blocks: shown for reference, it cannot change)"
        if used + len(part) <= budget:
            context.append(part)
            used += len(part)
        else:
            left_out.append(f"{path} ({text.count(chr(10))} lines)")
    if left_out:
        context.append("Other files of the program (no EVOLVE blocks, not shown): " + ", ".join(left_out))
    if context and view == "files":
        context.append("The files you may change (only between their EVOLVE-BLOCK markers):")
    return "\n\n".join(context + editable)


def _file_blocks(text: str, tag: str, cap: int | None = None) -> str:
    try:
        blocks = find_blocks(text)
    except BlockError:
        blocks = []
    bodies = [b.text.rstrip() for b in blocks]
    if cap is not None:
        bodies = [b if len(b) <= cap else b[:cap] + "\n# … (cut)" for b in bodies]
    if len(bodies) == 1:
        return f"```{tag}\n{bodies[0]}\n```"
    return "\n".join(f"Block {i}:\n```{tag}\n{b}\n```" for i, b in enumerate(bodies, 1))


def program_blocks(code: str, tag: str, cap: int | None = None) -> str:
    """Another program's blocks, grouped under the header of the file each lies in."""
    parts = []
    for path, start, end in file_spans(code):
        text = code[start:end]
        if has_markers(text):
            parts.append(f"=== FILE: {path} ===\n{_file_blocks(text, tag, cap)}")
    return "\n".join(parts)


def tree_rules(edit_format: str, tag: str) -> str:
    """How to name the file of each change: part of the ask's fixed instructions for such a program."""
    if edit_format == "diff":
        return (
            "The program has several files. Before the edits of each file, write that file's header line exactly "
            "as shown (for example `=== FILE: lib/params.py ===`), then its SEARCH/REPLACE edits; one variant may "
            "change several files. Only the EVOLVE blocks of the files shown may change.\n"
        )
    return (
        "The program has several files. For each file you change, write its header line exactly as shown (for "
        f"example `=== FILE: lib/params.py ===`), then a ```{tag} fenced block holding the complete new code of "
        "that file's EVOLVE block (one fence per block when a file has several, in order). One variant may change "
        "one file or several; the files it does not name stay as they are.\n"
    )
