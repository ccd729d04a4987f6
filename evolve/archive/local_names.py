"""Canonical local names: a program whose function-local variables were renamed is the same program.

Models rewrite a parent with `total` called `acc`, `i` called `idx`; such a variant costs an evaluation and
scores exactly as its parent. `canonicalize` renames, in place, every variable that only its own function (or
comprehension) can see to `_v0`, `_v1`, ... in the order the names first appear, so that such variants unparse to
the same text. It is a code-hash step, never shown to anyone; it must never make two programs that behave
differently look alike (a false duplicate silently loses a child), so it renames only what Python itself keeps
private to a scope, and when in doubt it renames nothing.

Renamed: names bound inside a function, lambda or comprehension by assignment (`=`, `+=`, annotated, walrus),
`for`/`with`/`except ... as`, `del`, match captures and comprehension targets; a nested function's name when it
is never decorated, is only ever called (its object never escapes, so its `__name__` is never read), is no
generator or coroutine, and makes no function, class or generator inside it (their `__qualname__` holds it).
Kept as written: module globals, class bodies (their names are attributes), attributes, keyword names, builtins,
imported names, classes, and parameters (a caller may pass them by keyword, and `inspect.signature` shows them).
Names in any `global` or `nonlocal` statement and names with `__` (private-name mangling) are kept everywhere.
Nothing at all is renamed in a program that could read local names at run time (`locals`, `vars`, `dir`,
`eval`, `exec`, frames and code objects, `inspect`, `traceback`, ...), nor where a comprehension's walrus
target shares a name with a comprehension variable (a compile error that renaming could hide).

What renaming still changes: the text of error messages and tracebacks that name a local
(`UnboundLocalError: ... 'total'`), as reformatting already changes their line numbers; programs are scored
by what they compute, not by the wording of their tracebacks.
"""

from __future__ import annotations

import ast

# Names that read a scope's local names at run time: a program that mentions one is left as written.
INTROSPECTING_BUILTINS = frozenset(
    {"locals", "vars", "dir", "eval", "exec", "compile", "breakpoint", "__import__", "__builtins__",
     # an attribute named at run time can be any of the attributes below, spelled so that no check sees it
     "getattr", "hasattr", "setattr", "delattr", "attrgetter", "methodcaller",
     # their messages name the local that was read before it was bound
     "UnboundLocalError", "NameError"}
)  # fmt: skip
INTROSPECTING_ATTRIBUTES = frozenset(
    {
        "f_locals", "f_back", "f_code", "tb_frame", "gi_frame", "cr_frame", "ag_frame", "_getframe",
        "currentframe", "settrace", "setprofile", "__code__", "co_varnames", "co_cellvars", "co_freevars",
        "__closure__", "capture_locals", "getouterframes", "getinnerframes", "walk_stack", "walk_tb",
        "__getattribute__", "__self__", "__traceback__", "__globals__", "getattr", "attrgetter",
    }
)  # fmt: skip
INTROSPECTING_MODULES = frozenset(
    {"inspect", "traceback", "pdb", "bdb", "dis", "importlib", "builtins", "marshal", "gc", "ctypes"}
)
_INTROSPECTING = INTROSPECTING_BUILTINS | INTROSPECTING_ATTRIBUTES | INTROSPECTING_MODULES

_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_TYPE_PARAM_NODES = tuple(
    getattr(ast, n) for n in ("TypeAlias", "TypeVar", "ParamSpec", "TypeVarTuple") if hasattr(ast, n)
)


# The commonest nodes that bind nothing and open no scope: walked without the checks below (it is the hot path).
_PLAIN = frozenset(
    {
        ast.Expr, ast.Assign, ast.AugAssign, ast.Return, ast.If, ast.For, ast.While, ast.With, ast.withitem,
        ast.Try, ast.BinOp, ast.BoolOp, ast.UnaryOp, ast.Compare, ast.Subscript, ast.Slice, ast.Tuple, ast.List,
        ast.Set, ast.Dict, ast.IfExp, ast.Starred, ast.JoinedStr, ast.FormattedValue, ast.comprehension,
        ast.Load, ast.Store, ast.Del, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow,
        ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot, ast.And,
        ast.Or, ast.Not, ast.USub, ast.UAdd, ast.Pass, ast.Break, ast.Continue, ast.Raise, ast.Assert,
    }
)  # fmt: skip


class Unsafe(Exception):
    """The program could observe its local names, or renaming could change whether it compiles."""


class _Scope:
    """One Python scope: what it binds and which of its bindings must keep their names."""

    __slots__ = ("bound", "defs", "fixed", "kind", "parent")

    def __init__(self, kind: str, parent: _Scope | None) -> None:
        self.kind = kind  # module | class | function | comprehension
        self.parent = parent
        self.bound: set[str] = set()  # every name this scope binds (which makes it local here)
        self.fixed: set[str] = set()  # bound here, but keeps its name: parameters, imports, classes
        self.defs: set[str] = set()  # bound by a nested `def`: renamed only if only ever called

    def owner(self, name: str) -> _Scope | None:
        """The scope whose variable `name` means here (None: a global or a builtin), as the compiler resolves it:
        a class body sees its own names, enclosed scopes skip class bodies."""
        if name in self.bound:
            return self
        scope = self.parent
        while scope is not None and scope.kind != "module":
            if scope.kind != "class" and name in scope.bound:
                return scope
            scope = scope.parent
        return None


class _Occurrence:
    __slots__ = ("field", "name", "node", "pinned", "plain_call", "scope")

    def __init__(self, node: ast.AST, field: str, name: str, scope: _Scope, plain_call: bool, pinned: bool) -> None:
        self.node, self.field, self.name, self.scope = node, field, name, scope
        self.plain_call = plain_call  # the callee of a call: a nested function's name used so does not escape
        self.pinned = pinned  # in an annotation, whose text `from __future__ import annotations` keeps


class _Collector:
    """One walk over the tree: the scopes, every renamable occurrence of a name in source order, every identifier
    (so the canonical names can be chosen unused), and the reasons not to rename at all."""

    def __init__(self) -> None:
        self.occurrences: list[_Occurrence] = []
        self.identifiers: set[str] = set()
        self.declared: set[str] = set()  # in a global or nonlocal statement somewhere
        self.called: set[int] = set()  # ids of Name nodes that are the callee of a call
        self.comprehension_targets: set[str] = set()
        self.comprehension_walruses: set[str] = set()
        self.named = 0  # objects seen so far that carry the name of the function they are made in (qualname)

    def use(self, node: ast.AST, field: str, name: str, scope: _Scope, plain_call: bool = False) -> None:
        self.identifiers.add(name)
        self.occurrences.append(_Occurrence(node, field, name, scope, plain_call, self._in_annotation))

    def visit(self, node: ast.AST, scope: _Scope) -> None:
        if type(node) in _PLAIN:
            for child in ast.iter_child_nodes(node):
                self.visit(child, scope)
            return
        if isinstance(node, ast.Name):
            name = node.id
            if name in INTROSPECTING_BUILTINS:
                raise Unsafe(name)
            if not isinstance(node.ctx, ast.Load):
                scope.bound.add(name)
                if scope.kind == "comprehension" and self._in_target:
                    self.comprehension_targets.add(name)
            self.use(node, "id", name, scope, plain_call=id(node) in self.called and isinstance(node.ctx, ast.Load))
            return
        if isinstance(node, ast.Attribute):
            if node.attr in INTROSPECTING_ATTRIBUTES:
                raise Unsafe(node.attr)
            self.identifiers.add(node.attr)
            self.visit(node.value, scope)
            return
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                self.called.add(id(node.func))
        elif isinstance(node, ast.Constant):
            if isinstance(node.value, str) and node.value in _INTROSPECTING:
                raise Unsafe(node.value)
            return
        elif isinstance(node, _FUNCTIONS):
            self._function(node, scope)
            return
        elif isinstance(node, ast.Lambda):
            self.named += 1
            self._arguments(node.args, scope)
            inner = _Scope("function", scope)
            self._parameters(node.args, inner)
            self.visit(node.body, inner)
            return
        elif isinstance(node, ast.ClassDef):
            if getattr(node, "type_params", None):
                raise Unsafe("type parameters")
            for child in (*node.decorator_list, *node.bases, *node.keywords):
                self.visit(child, scope)
            self.named += 1
            scope.bound.add(node.name)
            scope.fixed.add(node.name)
            self.identifiers.add(node.name)
            body = _Scope("class", scope)
            for child in node.body:
                self.visit(child, body)
            return
        elif isinstance(node, _COMPREHENSIONS):
            self.named += isinstance(node, ast.GeneratorExp)
            self._comprehension(node, scope)
            return
        elif isinstance(node, ast.NamedExpr):
            target = scope
            while target.kind == "comprehension":
                target = target.parent  # type: ignore[assignment]
            if target is not scope:
                self.comprehension_walruses.add(node.target.id)
            target.bound.add(node.target.id)
            self.use(node.target, "id", node.target.id, target)
            self.visit(node.value, scope)
            return
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name.split(".")[0] in INTROSPECTING_MODULES or (
                    isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in INTROSPECTING_MODULES
                ):
                    raise Unsafe(alias.name)
                bound = alias.asname or alias.name.split(".")[0]
                scope.bound.add(bound)
                scope.fixed.add(bound)
                self.identifiers.update((bound, *alias.name.split(".")))
            return
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            self.declared.update(node.names)
            self.identifiers.update(node.names)
            return
        elif isinstance(node, ast.keyword):
            if node.arg is not None:
                if node.arg in INTROSPECTING_ATTRIBUTES:
                    raise Unsafe(node.arg)
                self.identifiers.add(node.arg)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)):
            if node.name is not None:
                scope.bound.add(node.name)
                self.use(node, "name", node.name, scope)
        elif isinstance(node, ast.MatchMapping):
            if node.rest is not None:
                scope.bound.add(node.rest)
                self.use(node, "rest", node.rest, scope)
        elif isinstance(node, ast.AnnAssign):
            self.visit(node.target, scope)
            self._annotation(node.annotation, scope)
            if node.value is not None:
                self.visit(node.value, scope)
            return
        elif isinstance(node, (ast.Yield, ast.YieldFrom, ast.Await)):
            self.named += 1  # a generator or coroutine function: its call returns an object with its name
        elif isinstance(node, ast.MatchClass):
            self.identifiers.update(node.kwd_attrs)
        elif _TYPE_PARAM_NODES and isinstance(node, _TYPE_PARAM_NODES):
            raise Unsafe("type parameters")
        for child in ast.iter_child_nodes(node):
            self.visit(child, scope)

    _in_target = False  # visiting a comprehension's target
    _in_annotation = False  # visiting an annotation

    def _annotation(self, node: ast.expr, scope: _Scope) -> None:
        self._in_annotation = True
        try:
            self.visit(node, scope)
        finally:
            self._in_annotation = False

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, scope: _Scope) -> None:
        if getattr(node, "type_params", None):
            raise Unsafe("type parameters")
        for child in node.decorator_list:
            self.visit(child, scope)
        self._arguments(node.args, scope)
        if node.returns is not None:
            self._annotation(node.returns, scope)
        scope.bound.add(node.name)
        self.use(node, "name", node.name, scope)
        inner = _Scope("function", scope)
        self._parameters(node.args, inner)
        named_before = self.named
        for child in node.body:
            self.visit(child, inner)
        # Its name is readable through a decorator (which receives the function), through the generator or
        # coroutine a call returns, and in the `__qualname__` of any function, class or generator made inside it.
        if node.decorator_list or isinstance(node, ast.AsyncFunctionDef) or self.named != named_before:
            scope.fixed.add(node.name)
        else:
            scope.defs.add(node.name)
        self.named += 1

    def _arguments(self, args: ast.arguments, scope: _Scope) -> None:
        """Defaults and annotations: evaluated where the function is defined, not inside it."""
        for default in (*args.defaults, *args.kw_defaults):
            if default is not None:
                self.visit(default, scope)
        for arg in (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg):
            if arg is not None and arg.annotation is not None:
                self._annotation(arg.annotation, scope)

    def _parameters(self, args: ast.arguments, inner: _Scope) -> None:
        for arg in (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg):
            if arg is not None:
                inner.bound.add(arg.arg)
                inner.fixed.add(arg.arg)
                self.identifiers.add(arg.arg)

    def _comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp, scope: _Scope) -> None:
        """The first iterable is evaluated in the enclosing scope; everything else in the comprehension's own."""
        self.visit(node.generators[0].iter, scope)
        inner = _Scope("comprehension", scope)
        for index, generator in enumerate(node.generators):
            if index:
                self.visit(generator.iter, inner)
            self._in_target = True
            try:
                self.visit(generator.target, inner)
            finally:
                self._in_target = False
            for condition in generator.ifs:
                self.visit(condition, inner)
        parts = (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,)
        for part in parts:
            self.visit(part, inner)


def _renamable(collector: _Collector) -> dict[tuple[int, str], list[_Occurrence]]:
    """(scope, name) → its occurrences, for each variable that may be renamed, in order of first appearance."""
    found: dict[tuple[int, str], list[_Occurrence]] = {}
    refused: set[tuple[int, str]] = set()
    for occurrence in collector.occurrences:
        owner = occurrence.scope.owner(occurrence.name)
        if owner is None or owner.kind in ("module", "class"):
            continue
        key = (id(owner), occurrence.name)
        if key in refused:
            continue
        name = occurrence.name
        keep = occurrence.pinned or name in owner.fixed or name in collector.declared or "__" in name
        if not keep and name in owner.defs:
            keep = not (occurrence.plain_call or isinstance(occurrence.node, _FUNCTIONS))
        if keep:
            refused.add(key)
            found.pop(key, None)
            continue
        found.setdefault(key, []).append(occurrence)
    return found


def _fresh_prefix(identifiers: set[str]) -> str:
    """A prefix no identifier of the program is the prefix and a number of: the canonical names clash with none."""
    prefix = "_v"
    while any(i.startswith(prefix) and i[len(prefix) :].isdigit() for i in identifiers):
        prefix += "_"
    return prefix


def canonicalize(tree: ast.Module) -> bool:
    """Rename the tree's local variables canonically, in place; False when it was left as it was (nothing to
    rename, or the program could tell)."""
    collector = _Collector()
    module = _Scope("module", None)
    try:
        for statement in tree.body:
            collector.visit(statement, module)
    except Unsafe:
        return False
    except RecursionError:
        return False
    if collector.comprehension_targets & collector.comprehension_walruses:
        return False  # `[x := 1 for x in y]` does not compile; renamed apart, it would
    variables = _renamable(collector)
    if not variables:
        return False
    prefix = _fresh_prefix(collector.identifiers)
    for number, occurrences in enumerate(variables.values()):
        for occurrence in occurrences:
            setattr(occurrence.node, occurrence.field, f"{prefix}{number}")
    return True
