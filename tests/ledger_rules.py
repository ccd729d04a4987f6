"""The rule of tests/test_ledger_writers.py, read from the code's syntax: which classes hold the run's state, which
of their methods change it, what reaches them, and which modules may change what.

What a mutator is comes from the classes' own method definitions: a method that assigns to `self...`, calls a
mutating method on what `self` holds, or calls another such method of its class. Which names reach these objects
comes from the code too: attributes, parameters and properties annotated with (or assigned an instance of) the
class. The code is first rewritten by tests/ledger_normal.py so that aliases, `getattr`/`setattr` with a literal
name, lambdas and helpers handed an object read as the direct access they are. The only hand-written part is the
rule itself: which modules may change which state (`WRITERS`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.ledger_normal import module_functions, normalize_one, normalized

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("evolve", "policies", "sandboxes")

# The rule: each guarded class (module, name) and the modules that may change it (its own module always may).
LEDGER_SIDE = frozenset({"evolve.ledger"})
WRITERS: dict[tuple[str, str], frozenset[str]] = {
    ("evolve.ledger", "RunLedger"): frozenset({"evolve.loop", "evolve.flow"}),
    ("evolve.control", "RunControl"): LEDGER_SIDE,
    ("evolve.selection.population", "Population"): LEDGER_SIDE,
    ("evolve.stats", "LoopStats"): LEDGER_SIDE,
    ("evolve.code_index", "CodeIndex"): LEDGER_SIDE,
    ("evolve.ensemble", "Ensemble"): LEDGER_SIDE,
    ("evolve.stopping", "Stall"): LEDGER_SIDE,
    ("evolve.stopping", "Patience"): LEDGER_SIDE,
    ("evolve.stopping", "FailureStreaks"): LEDGER_SIDE,
    # The run's live tally is the ledger's; the archive's summary fills one of its own from the stored rows.
    ("evolve.yields", "QualityTally"): LEDGER_SIDE | {"evolve.archive.summary"},
}
# The stages: handed values (a parent pool, events to stop on, records), never a live part of the ledger.
STAGES = ("evolve.group_sampler", "evolve.evaluation", "evolve.commit", "evolve.policy_calls")
# Methods of a container or an event that change it (what `self.x.append(...)` and the like do to held state).
CONTAINER_MUTATORS = frozenset(
    {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "add", "discard", "setdefault",
     "set", "sort", "reverse", "put", "put_nowait", "subtract", "appendleft", "popleft", "extendleft"}
)  # fmt: skip
# Queries by their names: properties, and methods that ask (`may_*`, `is_*`, `has_*`, `*_due`, `*_left`,
# `*_refusal`) or read out (`status`, `stop_reason`, `parent_pool`).
# Read-only views of the run's events handed to the stages, and the events themselves in a stage: never set there.
SIGNAL_TYPES = frozenset({"StopSignal"})
EVENT_SETTERS = frozenset({"set", "clear"})
CONTAINER_WRITES = CONTAINER_MUTATORS | {"__setitem__", "__delitem__", "__setattr__", "__delattr__", "__iadd__"}
QUERY_NAME = re.compile(r"^(may_|is_|has_)|(_due|_left|_refusal)$|^(status|stop_reason|parent_pool)$")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def scanned_sources() -> dict[str, str]:
    return {
        module_name(p): p.read_text()
        for top in SCANNED
        for p in sorted((ROOT / top).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def _root_is_self(node: ast.expr) -> bool:
    """`self.a`, `self.a[k]`, `self.a.b` (not `self` alone)."""
    if not isinstance(node, ast.Attribute | ast.Subscript):
        return False
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return isinstance(node, ast.Name) and node.id == "self"


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign):
        targets = [node.target]
    elif isinstance(node, ast.Delete):
        targets = node.targets
    else:
        return []
    flat: list[ast.expr] = []
    for t in targets:
        flat.extend(t.elts if isinstance(t, ast.Tuple | ast.List) else [t])
    return flat


@dataclass
class ClassInfo:
    module: str
    node: ast.ClassDef

    def methods(self) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        return {n.name: n for n in self.node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}

    def properties(self) -> set[str]:
        return {
            name
            for name, fn in self.methods().items()
            if any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list)
        }

    def attributes(self) -> set[str]:
        """Its fields (class-level annotations) and whatever its methods assign to `self.X`, and its properties."""
        names = {n.target.id for n in self.node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        for fn in self.methods().values():
            for node in ast.walk(fn):
                for t in _targets(node):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        names.add(t.attr)
        return names | self.properties()


def classes(trees: dict[str, ast.Module]) -> dict[tuple[str, str], ClassInfo]:
    return {
        (module, node.name): ClassInfo(module, node)
        for module, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    }


def _pairs(node: ast.Assign | ast.AnnAssign) -> list[tuple[ast.expr, ast.expr | None]]:
    """(target, value) of an assignment, a tuple assignment taken pairwise."""
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    pairs: list[tuple[ast.expr, ast.expr | None]] = []
    for target in targets:
        if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
            pairs += list(zip(target.elts, node.value.elts, strict=False))
        else:
            pairs.append((target, node.value))
    return pairs


def held_types(info: ClassInfo, class_names: set[str]) -> dict[str, str]:
    """What each attribute of the class holds, where the code says: `self.x = K(...)`, `self.x = param` of a
    parameter annotated `K`, or a field `x: K` (K one of the scanned classes)."""
    held: dict[str, str] = {}
    for node in info.node.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            for kind in _annotation_names(node.annotation) & class_names:
                held[node.target.id] = kind
    for fn in info.methods().values():
        params = {a.arg: _annotation_names(a.annotation) & class_names for a in fn.args.args + fn.args.kwonlyargs}
        for node in ast.walk(fn):
            if not isinstance(node, ast.Assign | ast.AnnAssign):
                continue
            for target, value in _pairs(node):
                if not (isinstance(target, ast.Attribute) and _label(target.value) == "self"):
                    continue
                if isinstance(value, ast.Call) and _label(value.func) in class_names:
                    held[target.attr] = _label(value.func) or ""
                elif isinstance(value, ast.Name) and params.get(value.id):
                    held[target.attr] = next(iter(params[value.id]))
    return held


@dataclass(frozen=True)
class MethodFacts:
    """What one method does to `self`, read once: whether it assigns to `self...`, the methods it calls on what
    `self` holds (with the class of the holder where `held_types` knows it), and its own class's methods it calls."""

    assigns: bool
    held_calls: tuple[tuple[str | None, str], ...]  # (class held, or None: a container or unknown; method name)
    self_calls: frozenset[str]


def method_facts(fn: ast.AST, held: dict[str, str]) -> MethodFacts:
    assigns, held_calls, self_calls = False, [], set()
    for node in ast.walk(fn):
        assigns = assigns or any(_root_is_self(t) for t in _targets(node))
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver, name = node.func.value, node.func.attr
        if isinstance(receiver, ast.Name) and receiver.id == "self":
            self_calls.add(name)
        elif _root_is_self(receiver):
            direct = isinstance(receiver, ast.Attribute) and _label(receiver.value) == "self"
            kind = held.get(receiver.attr) if direct and isinstance(receiver, ast.Attribute) else None
            held_calls.append((kind, name))
    return MethodFacts(assigns, tuple(held_calls), frozenset(self_calls))


def mutators(known: dict[tuple[str, str], ClassInfo]) -> dict[tuple[str, str], set[str]]:
    """Each class's mutating methods, to a fixed point: a method that assigns to `self...`, calls a mutator of what
    `self` holds (the holder's class's mutators where `held_types` knows it, else a container's), or calls a mutator
    of its own class."""
    class_names = {cls for _, cls in known}
    facts = {
        key: {
            name: method_facts(fn, held_types(info, class_names))
            for name, fn in info.methods().items()
            if name != "__init__"
        }
        for key, info in known.items()
    }
    found: dict[tuple[str, str], set[str]] = {key: {n for n, f in fs.items() if f.assigns} for key, fs in facts.items()}
    while True:
        by_name: dict[str, set[str]] = {}
        for (_, cls), names in found.items():
            by_name.setdefault(cls, set()).update(names)
        changed = False
        for key, methods in facts.items():
            for name, f in methods.items():
                if name in found[key]:
                    continue
                held = any(n in (CONTAINER_MUTATORS if k is None else by_name.get(k, set())) for k, n in f.held_calls)
                if held or f.self_calls & found[key]:
                    found[key].add(name)
                    changed = True
        if not changed:
            return found


def _annotation_names(annotation: ast.expr | None) -> set[str]:
    if annotation is None:
        return set()
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        return set(re.findall(r"\w+", annotation.value))
    return {n.id for n in ast.walk(annotation) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(annotation) if isinstance(n, ast.Attribute)
    }


def _label(node: ast.expr) -> str | None:
    """The last name of a receiver: `population` of `self.ledger.population`, `control` of `calls.control`."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def bindings(tree: ast.AST) -> dict[str, set[str]]:
    """Each name's types as one module (or all of them) says: a parameter or attribute annotated with a type, a
    function or property returning one, or a name assigned a new instance (`x = K(...)`); by the name's last part."""
    bound: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            name, types = node.arg, _annotation_names(node.annotation)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name, types = node.name, _annotation_names(node.returns)
        elif isinstance(node, ast.AnnAssign):
            name, types = _label(node.target) or "", _annotation_names(node.annotation)
        else:
            name, types = "", set()
        if name and types:
            bound.setdefault(name, set()).update(types)
        if isinstance(node, ast.Assign):
            for target, value in _pairs(node):
                if isinstance(value, ast.Call) and (called := _label(value.func)) and called[:1].isupper():
                    bound.setdefault(_label(target) or "", set()).add(called)
    bound.pop("", None)
    bound.pop("self", None)
    return bound


@dataclass(frozen=True)
class Violation:
    module: str
    line: int
    text: str
    guarded: str

    def __str__(self) -> str:
        return f"{self.module}:{self.line}: {self.text} changes {self.guarded}, which only the ledger may"


@dataclass
class Rule:
    """The guarded classes as read from the code: their mutators, attributes and the names that reach them."""

    trees: dict[str, ast.Module]

    def __post_init__(self) -> None:
        self.keep_out = frozenset({m for key, mods in WRITERS.items() for m in {key[0], *mods}})
        self.functions = module_functions(self.trees)
        self.trees = normalized(self.trees, self.keep_out)
        known = classes(self.trees)
        missing = [key for key in WRITERS if key not in known]
        assert not missing, f"guarded classes not found (renamed or moved?): {missing}; update WRITERS"
        every = mutators(known)
        names: dict[str, set[str]] = {}
        for tree in self.trees.values():
            for name, types in bindings(tree).items():
                names.setdefault(name, set()).update(types)
        self.guarded = {
            key: (
                every[key],
                known[key].attributes(),
                {name for name, types in names.items() if key[1] in types},
                WRITERS[key] | {key[0]},
            )
            for key in WRITERS
        }
        self.known, self.every = known, every

    def violations(self, module: str, tree: ast.Module) -> Iterator[Violation]:
        """What in `module` (its code as parsed; rewritten here) changes a guarded object it may not change:
        - a call of a guarded class's mutator, from a module `WRITERS` does not allow;
        - a write to an attribute of one (`x.a = v`, `x.a[k] += 1`, `x.a.update(...)`, `setattr`), from any
          module but its own and the ledger;
        - `getattr`/`setattr`/`delattr` with a computed name on one;
        - `__self__` (a bound method's owner), outside the ledger's side;
        - `set()`/`clear()` on a stop signal (`SIGNAL_TYPES`), or on an event in a stage.
        A bare name this module binds to other types only (a trainer's own `stats`) reaches none of them."""
        tree = normalize_one(module, tree, self.functions, self.keep_out)
        local = bindings(tree)

        def reaches(receiver: ast.expr, cls: str, reached_by: set[str]) -> bool:
            label = _label(receiver)
            if label not in reached_by:
                return False
            return not (isinstance(receiver, ast.Name) and label in local and cls not in local[label])

        def written(node: ast.expr, text: str) -> Iterator[Violation]:
            """Each attribute along `node` (`a.b[k].c`) that belongs to a guarded object this module may not write."""
            while isinstance(node, ast.Attribute | ast.Subscript):
                if isinstance(node, ast.Attribute):
                    for (home, cls), (_, attributes, reached_by, _) in self.guarded.items():
                        if module in {home, *LEDGER_SIDE} or node.attr not in attributes:
                            continue
                        if reaches(node.value, cls, reached_by):
                            yield Violation(module, node.lineno, text, f"{home}.{cls}")
                node = node.value

        def any_guarded(node: ast.expr) -> str | None:
            for (home, cls), (_, _, reached_by, allowed) in self.guarded.items():
                if module not in allowed and reaches(node, cls, reached_by):
                    return f"{home}.{cls}"
            return None

        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "__self__" and module not in CONTROL_SIDE:
                yield Violation(module, node.lineno, ast.unparse(node)[:80], "the owner of a bound method")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) >= 2:
                dynamic = node.func.id in {"getattr", "setattr", "delattr"} and _literal(node.args[1]) is None
                if dynamic and (whose := any_guarded(node.args[0])):
                    yield Violation(module, node.lineno, ast.unparse(node)[:80], f"(a computed name) {whose}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                text = ast.unparse(node)[:80]
                for (home, cls), (changes, _, reached_by, allowed) in self.guarded.items():
                    if module in allowed or node.func.attr not in changes:
                        continue
                    if reaches(node.func.value, cls, reached_by):
                        yield Violation(module, node.lineno, text, f"{home}.{cls}")
                if node.func.attr in CONTAINER_WRITES:
                    yield from written(node.func.value, text)
                if node.func.attr in EVENT_SETTERS and module not in CONTROL_SIDE:
                    types = local.get(_label(node.func.value) or "", set())
                    if types & SIGNAL_TYPES or (module in STAGES and "Event" in types):
                        yield Violation(module, node.lineno, text, "the run's stop signals")
            for target in _targets(node):
                yield from written(target, ast.unparse(target)[:80])


CONTROL_SIDE = LEDGER_SIDE | {"evolve.control"}


def _literal(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def parsed(sources: dict[str, str]) -> dict[str, ast.Module]:
    return {module: ast.parse(text) for module, text in sources.items()}


def all_violations(sources: dict[str, str], rule: Rule | None = None) -> list[Violation]:
    trees = parsed(sources)
    rule = rule or Rule(trees)
    return [v for module, tree in trees.items() for v in rule.violations(module, tree)]


def writing_queries(sources: dict[str, str], rule: Rule | None = None) -> list[str]:
    """The queries (by name: `QUERY_NAME`, and properties) of the ledger and its control that change state."""
    rule = rule or Rule(parsed(sources))
    out = []
    for key in (("evolve.ledger", "RunLedger"), ("evolve.control", "RunControl")):
        info = rule.known[key]
        queries = {n for n in info.methods() if QUERY_NAME.search(n)} | info.properties()
        out += [f"{key[1]}.{n}" for n in sorted(queries & rule.every[key])]
    return out
