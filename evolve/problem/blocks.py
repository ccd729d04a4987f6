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
