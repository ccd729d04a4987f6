"""Which editable block each piece of a variant's code rewrites, told from the names the code defines.

A whole rewrite of a program with several EVOLVE blocks is meant to give one fence per block, in order. Small
models rarely do: they rewrite only the block they changed, put two blocks' functions in one fence, or give the
blocks in another order. Each of those is still an unambiguous answer, because a block is known by the names it
defines (`def order`, `class Packer`, `FILL = 0.6`, `fn score`, `int main(`): a piece of code that defines a name
of exactly one block rewrites that block, and blocks that no piece names stay as they are.

Python code is split at its top-level statements (so one fence may carry several blocks); code in another
language is matched fence by fence. A piece that defines one function named like no block's goes to the one
block whose only function takes the same parameters (one or more), renamed back: small models rename what they
rewrite. Whatever cannot be placed without guessing (a piece that names no block or two blocks, or two pieces
for one block) makes the whole match fail, and the caller falls back to its rule by position.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

from evolve.prompts.parse_limits import UNLIMITED, Deadline

# Top-level definitions in the languages programs come in: Python, Rust, C/C++ function heads.
_DEFINES = re.compile(
    r"^(?:async[ \t]+def|def|class)[ \t]+(\w+)"
    r"|^(?:pub[ \t]+)?(?:fn|struct|enum|const|static)[ \t]+(\w+)(?=[ \t]*[:<({=;])"
    r"|^(\w+)[ \t]*(?::[^=\n]*)?=(?!=)"
    r"|^(?:(?:static|inline|const|unsigned|signed|long|short|struct)[ \t]+)*[A-Za-z_]\w*[ \t*&]+(\w+)[ \t]*\([^;\n]*$",
    re.M,
)


def defined_names(code: str) -> set[str]:
    """The names that `code` defines at its top level (column 0)."""
    return {next(g for g in m.groups() if g) for m in _DEFINES.finditer(code)}


def match_blocks(
    blocks: Sequence[str], pieces: Sequence[str], python: bool, deadline: Deadline = UNLIMITED
) -> list[str] | None:
    """Each block's new text (a block no piece names keeps its text), or None when the pieces cannot all be placed
    on exactly one block each (see the module docstring). Each piece may parse every block again (a renamed
    function's): the deadline is checked per piece."""
    names = [defined_names(b) for b in blocks]
    new: dict[int, str] = {}
    for piece in pieces:
        deadline.check()
        parts = _python_parts(piece, names) if python else _whole(piece, names)
        if parts is None and python:
            parts = _renamed(piece, blocks)
        if parts is None:
            return None
        for index, text in parts.items():
            if index in new:  # two pieces for one block: which one was meant is a guess
                return None
            new[index] = text
    if not new:
        return None
    return [new.get(i, block) for i, block in enumerate(blocks)]


def _hits(defined: set[str], names: Sequence[set[str]]) -> list[int]:
    """The blocks whose names `defined` meets."""
    return [i for i, block_names in enumerate(names) if defined & block_names]


def _whole(piece: str, names: Sequence[set[str]]) -> dict[int, str] | None:
    hits = _hits(defined_names(piece), names)
    return {hits[0]: piece} if len(hits) == 1 else None


def _python_parts(piece: str, names: Sequence[set[str]]) -> dict[int, str] | None:
    """The piece cut at its top-level statements, each run of statements given to the block it defines names of;
    statements that define no block's name (imports, helpers, comments) go with the definition after them."""
    try:
        body = ast.parse(piece).body
    except SyntaxError:
        return None
    owners: list[int | None] = []
    for node in body:
        hits = _hits(_node_names(node), names)
        if len(hits) > 1:
            return None
        owners.append(hits[0] if hits else None)
    if all(o is None for o in owners):
        return None
    filled: list[int] = []
    pending = 0
    for owner in owners:  # an unowned statement joins the next owned one (the last ones join the one before)
        if owner is None:
            pending += 1
            continue
        filled += [owner] * (pending + 1)
        pending = 0
    filled += [filled[-1]] * pending
    lines = piece.split("\n")
    parts: dict[int, list[str]] = {}
    previous_end = 0
    for k, (node, owner) in enumerate(zip(body, filled, strict=True)):
        if owner in parts and filled[k - 1] != owner:
            return None  # a block's statements split by another block's: which order was meant is a guess
        end = node.end_lineno or node.lineno
        parts.setdefault(owner, []).extend(lines[previous_end:end])
        previous_end = end
    parts[filled[-1]].extend(lines[previous_end:])
    return {i: "\n".join(chunk).strip("\n") + "\n" for i, chunk in parts.items()}


def functions(code: str) -> list[tuple[str, tuple[str, ...]]]:
    """(name, parameter names) of each top-level function of `code`; none when it does not parse."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return []
    return [
        (n.name, tuple(a.arg for a in n.args.posonlyargs + n.args.args + n.args.kwonlyargs))
        for n in body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def _renamed(piece: str, blocks: Sequence[str]) -> dict[int, str] | None:
    """Small models rename the function they rewrite (`order(items)` comes back as `rank(items)`): a piece that
    defines one function, named like no block's, goes to the one block whose only function takes the same
    parameters, under that function's name (the code around the block calls it by that name)."""
    mine = functions(piece)
    if len(mine) != 1 or not mine[0][1]:  # no parameters: any function without them would match
        return None
    (new_name, params), hits = mine[0], []
    for i, block in enumerate(blocks):
        theirs = functions(block)
        if len(theirs) == 1 and theirs[0][1] == params:
            hits.append((i, theirs[0][0]))
    if len(hits) != 1:
        return None
    index, old_name = hits[0]
    return {index: re.sub(rf"\b{re.escape(new_name)}\b", old_name, piece)}


def _node_names(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()
