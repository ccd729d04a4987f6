"""Docstrings set aside: a program that differs from a known one only in its docstrings is the same program.

Models rewrite the parent with a new docstring ("Improved version: uses a sort key ...") and nothing else; such
a variant costs an evaluation and scores exactly as its parent. Comments already vanish when the code hash
parses and unparses; docstrings are string constants in the tree and survive, so `strip_docstrings` removes
them before the hash is taken. Like `local_names.py` it is a code-hash step, never shown to anyone, and it must
never merge two programs that behave differently (a false duplicate silently loses a child):

- A bare string statement that is not a docstring (a string used as a comment, anywhere in a body) is dropped
  always: the compiler drops it too, nothing at run time can read it.
- A docstring (the first statement of a module, class or function, a string) is readable as `__doc__`; it is
  dropped only when the program has no way to read it: no `__doc__`, `__dict__`, `globals`, `help`, `pydoc`,
  `doctest`, and none of what keeps the local names (`getattr`, `vars`, `eval`, `inspect`, frames, ...: see
  `local_names.INTROSPECTING_*`), spelled as a name, an attribute, a keyword, an import or a string constant.

A body left empty gets `pass`, as `python -OO` compiles it. Reading the source text itself (`open(__file__)`,
`inspect.getsource`) can tell any two texts apart; like comments and layout, that is not held against the merge
(`inspect` keeps everything as written anyway).
"""

from __future__ import annotations

import ast

from evolve.archive.local_names import INTROSPECTING_ATTRIBUTES, INTROSPECTING_BUILTINS, INTROSPECTING_MODULES

DOC_READERS = frozenset(
    {"__doc__", "__dict__", "globals", "help", "getdoc", "pydoc", "doctest", "__getattr__", "__getattribute__"}
)
_READERS = DOC_READERS | INTROSPECTING_BUILTINS | INTROSPECTING_ATTRIBUTES | INTROSPECTING_MODULES
_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_BODIES = ("body", "orelse", "finalbody")


def reads_docstrings(tree: ast.AST) -> bool:
    """Whether anything in the program could read a docstring at run time (see the module's docstring)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            spelled: tuple[str | None, ...] = (node.id,)
        elif isinstance(node, ast.Attribute):
            spelled = (node.attr,)
        elif isinstance(node, ast.keyword):
            spelled = (node.arg,)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            spelled = (node.value,)
        elif isinstance(node, ast.alias):
            spelled = (node.asname, *node.name.split("."))
        elif isinstance(node, ast.ImportFrom):
            spelled = tuple((node.module or "").split("."))
        else:
            continue
        if any(name in _READERS for name in spelled):
            return True
    return False


def _is_string_statement(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def strip_docstrings(tree: ast.Module) -> bool:
    """Drop, in place, every bare string statement, docstrings included unless the program can read them; False
    when the tree was left as it was."""
    keep_docstrings = reads_docstrings(tree)
    changed = False
    for node in ast.walk(tree):
        for field in _BODIES:
            body = getattr(node, field, None)
            if not isinstance(body, list) or not body or not isinstance(body[0], ast.stmt):
                continue
            docstring = body[0] if keep_docstrings and isinstance(node, _DOCUMENTED) and field == "body" else None
            kept = [s for s in body if s is docstring or not _is_string_statement(s)]
            if len(kept) == len(body):
                continue
            changed = True
            if not kept and not isinstance(node, ast.Module):
                kept = [ast.Pass()]
            setattr(node, field, kept)
    return changed
