"""A fixed Python file as its interface: what a variant may call or must fit, without the bodies it must not copy.

Why: shown whole, a fixed file drew most answers of a 0.5B model (it rewrote the fixed `solve()` instead of the
functions it may change: 58 of 72 variants on `knapsack_files`). Its docstrings, imports, signatures and
constants tell the model how its blocks are used; the bodies add only a text to copy. A file that does not parse
is shown whole (it is context either way).
"""

from __future__ import annotations

import ast

_ONE_LINE = 100  # a top-level assignment longer than this (a table of data) is left out


def _docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return [first]
    return []


def _stub(node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.stmt:
    node.body = [*_docstring(node.body), ast.Expr(ast.Constant(...))]
    return node


def _plain_kept(node: ast.stmt, in_class: bool) -> bool:
    """Imports (of the module) and one-line constants: what the blocks may use as they are."""
    if isinstance(node, ast.Import | ast.ImportFrom):
        return not in_class
    return isinstance(node, ast.Assign | ast.AnnAssign) and len(ast.unparse(node)) <= _ONE_LINE


def _kept(body: list[ast.stmt], in_class: bool) -> list[ast.stmt]:
    kept = _docstring(body)
    for node in body[len(kept) :]:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            kept.append(_stub(node))
        elif isinstance(node, ast.ClassDef):
            node.body = _kept(node.body, in_class=True) or [ast.Expr(ast.Constant(...))]
            kept.append(node)
        elif _plain_kept(node, in_class):
            kept.append(node)
    return kept


def python_interface(text: str) -> str | None:
    """The file's docstrings, imports, short constants and signatures (bodies as `...`); None when it does not
    parse as Python."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    tree.body = _kept(tree.body, in_class=False)
    return ast.unparse(tree)
