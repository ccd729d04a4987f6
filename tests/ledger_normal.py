"""The code's syntax rewritten into the plain form tests/ledger_rules.py reads: what refers to a live part of the
run's state is spelled out where it is used, so the rule judges what a name refers to, not the name.

- a local alias (`p = self.population`, then `p.group_done(...)`) is replaced by what it was assigned, in the
  order the statements run; a name bound to a fresh value (`population = set()`) is renamed, so it is no longer
  taken for the run's population;
- `getattr(x, "name")` becomes `x.name`, and `setattr(x, "name", v)` / `delattr(x, "name")` a write to it;
- a lambda applied at once (`(lambda q: q.group_done(...))(self.population)`) becomes its body with the argument
  in place of the parameter;
- a function of the scanned code that is handed an object (`_done(self.population, pid)`) has its body copied
  into the caller, arguments in place of parameters, under an `if False:` (read, never run), at the call's line.
  So a helper elsewhere that changes what it is handed is charged to the module that handed it over, whatever
  its parameter is called or annotated, and a ledger query that writes through a helper taking `self` is a
  writer too.
"""

from __future__ import annotations

import ast
import copy

# Calls that build a new, unrelated value: a name bound to one in a function is that function's own.
FRESH_CALLS = frozenset(
    {"set", "dict", "list", "tuple", "frozenset", "Counter", "defaultdict", "deque", "OrderedDict", "object", "str",
     "int", "float", "bytearray"}
)  # fmt: skip
INLINE_DEPTH = 3  # how deep helpers are followed into helpers


def is_path(node: ast.expr) -> bool:
    """A name, or attributes and subscripts of one (`self.ledger.stats`, `x.a[k]`): what an alias may stand for."""
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return isinstance(node, ast.Name)


def _fresh(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant | ast.List | ast.Dict | ast.Set | ast.Tuple | ast.JoinedStr):
        return True
    if isinstance(node, ast.ListComp | ast.DictComp | ast.SetComp | ast.GeneratorExp):
        return True
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FRESH_CALLS


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _at(node: ast.AST, line: int) -> ast.AST:
    for n in ast.walk(node):
        if "lineno" in n._attributes:
            n.lineno, n.end_lineno = line, line  # type: ignore[attr-defined]
    return node


class _Replace(ast.NodeTransformer):
    """Each loaded name of `by` replaced by a copy of its expression."""

    def __init__(self, by: dict[str, ast.expr]) -> None:
        self.by = by

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if isinstance(node.ctx, ast.Load) and node.id in self.by:
            return ast.copy_location(copy.deepcopy(self.by[node.id]), node)
        return node


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    a = fn.args
    return [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs] + [p.arg for p in (a.vararg, a.kwarg) if p]


def _bound_args(fn: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, call: ast.Call) -> dict[str, ast.expr]:
    """The parameters of `fn` that `call` hands a path (`self`, `self.population`, `ledger.stats`)."""
    positional = [p.arg for p in fn.args.posonlyargs + fn.args.args]
    bound = {name: arg for name, arg in zip(positional, call.args, strict=False) if not isinstance(arg, ast.Starred)}
    bound |= {k.arg: k.value for k in call.keywords if k.arg}
    return {name: arg for name, arg in bound.items() if is_path(arg) and _handed(arg)}


def _handed(arg: ast.expr) -> bool:
    """`self` or a part of something (`self.population`, `ledger.stats`): a bare local name is not followed (its
    alias, if any, is already spelled out), which keeps the copying small."""
    return not isinstance(arg, ast.Name) or arg.id == "self"


Functions = dict[str, tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]


def module_functions(trees: dict[str, ast.Module]) -> dict[str, Functions]:
    """For each module, the module-level functions of the scanned code its bare names call: its own, and those it
    imports by name from another scanned module (name -> (defining module, definition))."""
    own = {
        module: {n.name: (module, n) for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
        for module, tree in trees.items()
    }
    table: dict[str, Functions] = {}
    for module, tree in trees.items():
        names = dict(own[module])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in own:
                for alias in node.names:
                    if alias.name in own[node.module]:
                        names[alias.asname or alias.name] = own[node.module][alias.name]
        table[module] = names
    return table


class Normalizer(ast.NodeTransformer):
    """Rewrites one module (see the module's docstring). `keep_out`: modules whose helpers are not copied into a
    caller elsewhere (the homes of the guarded classes: what they do to what they are handed is theirs to do)."""

    def __init__(self, module: str, functions: dict[str, Functions], keep_out: frozenset[str], depth: int = 0):
        self.module, self.functions, self.keep_out, self.depth = module, functions, keep_out, depth
        self.scopes: list[dict[str, ast.expr]] = [{}]
        self.copied: list[list[ast.stmt]] = [[]]
        self.following: tuple[str, ...] = ()

    # ---- scopes: a function starts with its enclosing aliases, less its own parameters ---------------------
    def _scoped(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> ast.AST:
        inner = {k: v for k, v in self.scopes[-1].items() if k not in _params(node)}
        self.scopes.append(inner)
        self.copied.append([])
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d]:
            self.visit(default)
        if isinstance(node, ast.Lambda):
            node.body = self.visit(node.body)
        else:
            node.body = [s for stmt in node.body for s in _stmts(self.visit(stmt))]
        self.scopes.pop()
        copied = self.copied.pop()
        if copied and not isinstance(node, ast.Lambda):
            node.body.append(ast.If(ast.Constant(False), copied, []))
        elif copied:
            self.copied[-1].extend(copied)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _scoped  # type: ignore[assignment]

    def visit_Name(self, node: ast.Name) -> ast.expr:
        if isinstance(node.ctx, ast.Load) and node.id in self.scopes[-1]:
            return ast.copy_location(copy.deepcopy(self.scopes[-1][node.id]), node)
        return node

    def _bind(self, target: ast.expr, value: ast.expr | None) -> None:
        """After `target = value`: a name now stands for a path, for a fresh value of its own, or for nothing known."""
        scope = self.scopes[-1]
        if isinstance(target, ast.Name):
            if value is not None and is_path(value):
                scope[target.id] = value
            elif value is not None and _fresh(value):
                scope[target.id] = ast.Name(id=f"{target.id}__own", ctx=ast.Load())
            else:
                scope.pop(target.id, None)
        else:
            for n in ast.walk(target):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    scope.pop(n.id, None)

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        node.value = self.visit(node.value)
        node.targets = [t if isinstance(t, ast.Name) else self.visit(t) for t in node.targets]
        for t in node.targets:
            self._bind(t, node.value)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.AST:
        node.value = self.visit(node.value) if node.value else None
        node.target = node.target if isinstance(node.target, ast.Name) else self.visit(node.target)
        self._bind(node.target, node.value)
        return node

    def visit_For(self, node: ast.For | ast.AsyncFor) -> ast.AST:
        node.iter = self.visit(node.iter)
        self._bind(node.target, None)
        node.body = [s for stmt in node.body for s in _stmts(self.visit(stmt))]
        node.orelse = [s for stmt in node.orelse for s in _stmts(self.visit(stmt))]
        return node

    visit_AsyncFor = visit_For  # type: ignore[assignment]

    def visit_Expr(self, node: ast.Expr) -> ast.AST:
        """`setattr(x, "a", v)` is `x.a = v`, `delattr(x, "a")` is `del x.a`."""
        self.generic_visit(node)
        call = node.value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and len(call.args) >= 2:
            name = _literal(call.args[1])
            if name and call.func.id == "setattr" and len(call.args) == 3:
                target = ast.Attribute(call.args[0], name, ast.Store())
                return ast.copy_location(ast.Assign([target], call.args[2]), node)
            if name and call.func.id == "delattr":
                return ast.copy_location(ast.Delete([ast.Attribute(call.args[0], name, ast.Del())]), node)
        return node

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        getattr_of = isinstance(func, ast.Name) and func.id == "getattr" and len(node.args) >= 2
        if getattr_of and (name := _literal(node.args[1])):
            return ast.copy_location(ast.Attribute(node.args[0], name, ast.Load()), node)
        if isinstance(func, ast.Lambda):
            return ast.copy_location(_Replace(_bound_args(func, node)).visit(copy.deepcopy(func.body)), node)
        if isinstance(func, ast.Name):
            self._follow(func.id, node)
        return node

    def _follow(self, name: str, call: ast.Call) -> None:
        """Copy the body of the scanned function `name` into the caller, with what it is handed in place."""
        found = self.functions.get(self.module, {}).get(name)
        if found is None or self.depth >= INLINE_DEPTH or name in self.following:
            return
        home, fn = found
        bound = _bound_args(fn, call)
        if not bound or (home != self.module and home in self.keep_out):
            return
        body = _Replace(bound).visit(copy.deepcopy(ast.Module(fn.body, [])))
        inner = Normalizer(home, self.functions, self.keep_out, self.depth + 1)
        inner.following = (*self.following, name)
        inner.scopes = [{}]
        body = inner.visit(body)
        copied = [s for stmt in body.body for s in _stmts(stmt)] + inner.copied[0]
        self.copied[-1].extend(_at(s, call.lineno) for s in copied)  # type: ignore[misc]


def _stmts(node: ast.AST | list[ast.AST] | None) -> list[ast.stmt]:
    if node is None:
        return []
    return node if isinstance(node, list) else [node]  # type: ignore[list-item]


def normalize_one(
    module: str, tree: ast.Module, functions: dict[str, Functions], keep_out: frozenset[str]
) -> ast.Module:
    """One module rewritten (a copy)."""
    n = Normalizer(module, functions, keep_out)
    new = n.visit(copy.deepcopy(tree))
    if n.copied[0]:
        new.body.append(ast.If(ast.Constant(False), n.copied[0], []))
    return ast.fix_missing_locations(new)


def normalized(trees: dict[str, ast.Module], keep_out: frozenset[str]) -> dict[str, ast.Module]:
    """Every module rewritten (copies: the parsed trees are left as they were)."""
    functions = module_functions(trees)
    return {module: normalize_one(module, tree, functions, keep_out) for module, tree in trees.items()}
