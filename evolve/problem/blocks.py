"""EVOLVE-BLOCK markers: the only regions of a program that the model may change."""

from __future__ import annotations

import re
from dataclasses import dataclass

START, END = "EVOLVE-BLOCK-START", "EVOLVE-BLOCK-END"
_MARKER = re.compile(rf"^.*\b({START}|{END})\b.*$", re.MULTILINE)


@dataclass(frozen=True)
class EditableBlock:
    index: int
    start: int  # character offset of the block body in the file
    end: int
    text: str


class BlockError(ValueError):
    pass


def find_blocks(code: str) -> list[EditableBlock]:
    """The editable bodies between marker lines; the whole file when there are no markers."""
    markers = list(_MARKER.finditer(code))
    if not markers:
        return [EditableBlock(0, 0, len(code), code)]
    blocks: list[EditableBlock] = []
    open_at: int | None = None
    for m in markers:
        if m.group(1) == START:
            if open_at is not None:
                raise BlockError(f"nested {START} at offset {m.start()}")
            open_at = m.end() + 1 if m.end() < len(code) else m.end()
        else:
            if open_at is None:
                raise BlockError(f"{END} without {START} at offset {m.start()}")
            blocks.append(EditableBlock(len(blocks), open_at, m.start(), code[open_at : m.start()]))
            open_at = None
    if open_at is not None:
        raise BlockError(f"{START} is never closed")
    return blocks


def replace_blocks(code: str, new_bodies: list[str]) -> str:
    """Put new bodies into the blocks of `code`, keeping everything outside them byte for byte."""
    blocks = find_blocks(code)
    if len(new_bodies) != len(blocks):
        raise BlockError(f"expected {len(blocks)} block bodies, got {len(new_bodies)}")
    out, cursor = [], 0
    for block, body in zip(blocks, new_bodies, strict=True):
        if body and not body.endswith("\n") and block.end < len(code):
            body += "\n"
        out += [code[cursor : block.start], body]
        cursor = block.end
    out.append(code[cursor:])
    return "".join(out)


def frame_changes(parent: str, child: str) -> str | None:
    """Why `child` does not keep `parent`'s frame (its markers and every byte outside the blocks), or None.

    A child that adds, drops, nests or moves a marker, or changes text outside the blocks, would break every
    later prompt built from it; the parser rejects it as `bad_blocks`."""
    try:
        mine = find_blocks(child)
    except BlockError as exc:
        return f"EVOLVE markers broken: {exc}"
    theirs = find_blocks(parent)
    if len(mine) != len(theirs) or bool(_MARKER.search(child)) != bool(_MARKER.search(parent)):
        return f"{len(mine)} EVOLVE blocks where the parent has {len(theirs)}"
    if _frame(child, mine) != _frame(parent, theirs):
        return "text outside the EVOLVE blocks (or a marker line) changed"
    return None


def _frame(code: str, blocks: list[EditableBlock]) -> list[str]:
    out, cursor = [], 0
    for b in blocks:
        out.append(code[cursor : b.start])
        cursor = b.end
    out.append(code[cursor:])
    return out


def has_markers(code: str) -> bool:
    """True when `code` holds an EVOLVE marker: in a program of several files, a file without any is fixed."""
    return bool(_MARKER.search(code))
