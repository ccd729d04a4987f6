"""Docstrings set aside: a program that differs from a known one only in its docstrings is the same program.

Models rewrite the parent with a new docstring ("Improved version: uses a sort key ...") and nothing else; such
a variant costs an evaluation and scores exactly as its parent. Comments already vanish when the code hash
parses and unparses; docstrings are string constants in the tree and survive, so `strip_docstrings` removes
them before the hash is taken. Like `local_names.py` it is a code-hash step, never shown to anyone, and it must
never merge two programs that behave differently (a false duplicate silently loses a child):

- Nothing is set aside unless the program compiles and its whole text contains none of `SUSPECT_SUBSTRINGS`,
  a plain substring test, cheap and conservative. A tree walk for readers (the rule before) missed too much: a
  format string `"{0.__doc__}"`, a metaclass or `__init_subclass__` that counts the class namespace (which holds
  `__doc__`), unittest's `shortDescription`, warnings and tracebacks whose line numbers a docstring shifts, and a
  parent that does not compile (a second string before `from __future__`) that merging the strings fixes. Each
  of these spells one of the substrings; a program that merely mentions one (`helper`, `document`) only loses
  the merge, which costs one evaluation, never a child.
- Then a bare string statement that is not a docstring (a string used as a comment, anywhere in a body) is
  dropped: the compiler drops it too.
- A docstring (the first statement of a module, class or function, a string) is readable as `__doc__`; it is
  dropped only when, besides, no name that keeps the local names (`getattr`, `vars`, `eval`, `inspect`, frames,
  ...: see `local_names.INTROSPECTING_*`) or `DOC_READERS` is spelled as a name, an attribute, a keyword, an
  import or a string constant.

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
# Text that could read a docstring, a namespace or a line number (see the module's docstring); `doc` covers
# `__doc__`, `doctest`, `pydoc`, `getdoc`, `trace` covers `traceback` and `settrace`.
SUSPECT_SUBSTRINGS = (
    "doc", "metaclass", "__init_subclass__", "__prepare__", "__dict__", "vars", "dir(", "inspect", "unittest",
    "help", "warn", "trace", "lineno", "linecache", "frame", "_getframe", "__code__", "co_", "logging", "exc_info",
    "globals", "locals", "eval", "exec", "compile", "__future__", "getattr", "__class__", "__getattribute__",
)  # fmt: skip
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


def may_set_strings_aside(text: str, tree: ast.Module) -> bool:
    """Whether `text` (parsed as `tree`) compiles and spells nothing of `SUSPECT_SUBSTRINGS`."""
    if any(suspect in text for suspect in SUSPECT_SUBSTRINGS):
        return False
    try:
        compile(tree, "<candidate>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, TypeError):
        return False
    return True


def strip_docstrings(tree: ast.Module, text: str) -> bool:
    """Drop, in place, every bare string statement, docstrings included unless the program can read them; nothing
    where `text` may read strings, namespaces or line numbers at all (`may_set_strings_aside`). False when the
    tree was left as it was."""
    if not may_set_strings_aside(text, tree):
        return False
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
