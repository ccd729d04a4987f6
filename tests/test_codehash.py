"""The code hash: programs equal up to layout, comments and local names are one program; any two that could behave
differently are two. A false duplicate silently loses a child, so most of these tests are pairs that differ
only in names yet do different things.

`assert_compiles_alike` is the check behind the renaming: the normalised program must compile to the very
same instructions as the original, up to a one-to-one renaming of local, cell and free variables (and of the
names of nested functions), with the same globals, attributes and constants.
"""

from __future__ import annotations

import ast
import dis
import inspect
import textwrap
import types
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolve.archive.codehash import normalize, normalized_hash

ROOT = Path(__file__).resolve().parent.parent
SEEDS = sorted([*ROOT.glob("problems/*/seed.py"), *ROOT.glob("benchmarks/problems/*/seed.py")])
LOCAL_OPS = {"LOAD_FAST", "STORE_FAST", "DELETE_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "LOAD_DEREF",
             "STORE_DEREF", "DELETE_DEREF", "LOAD_CLOSURE", "MAKE_CELL", "LOAD_CLASSDEREF",
             "LOAD_FROM_DICT_OR_DEREF"}  # fmt: skip


def h(code: str) -> str:
    return normalized_hash(textwrap.dedent(code))


def _parameters(code: types.CodeType) -> tuple[str, ...]:
    count = code.co_argcount + code.co_kwonlyargcount
    count += bool(code.co_flags & inspect.CO_VARARGS) + bool(code.co_flags & inspect.CO_VARKEYWORDS)
    return code.co_varnames[:count]


def _instructions(code: types.CodeType) -> list[dis.Instruction]:
    """Without the no-ops, and without PUSH_NULL: CPython 3.11 calls `x.m()` with LOAD_METHOD unless a module-level
    import is also called `x` (whatever scope `x` is in), so renaming a local may pick the other form."""
    return [i for i in dis.get_instructions(code) if i.opname not in ("NOP", "RESUME", "EXTENDED_ARG", "PUSH_NULL")]


def _opname(instruction: dis.Instruction) -> str:
    return "LOAD_ATTR" if instruction.opname == "LOAD_METHOD" else instruction.opname


def _compiled_alike(a: types.CodeType, b: types.CodeType, outer: dict[str, str], bind_outer=None) -> None:
    """Same instructions; each local, cell or free name of `a` stands for one of `b` and no other (free ones as
    the enclosing code renamed them, parameters as themselves); globals, attributes and constants equal. Cells
    are made and closures built in name order, so those instructions are compared as sets."""
    assert a.co_flags == b.co_flags and a.co_names == b.co_names and _parameters(a) == _parameters(b)
    names = {x: outer[x] for x in a.co_freevars if x in outer} | {p: p for p in (*_parameters(a), "__class__")}
    back = {y: x for x, y in names.items()}

    def same_local(x: str, y: str) -> None:
        assert names.setdefault(x, y) == y and back.setdefault(y, x) == x, f"{x} and {y} are not one renaming"

    ia, ib = _instructions(a), _instructions(b)
    assert [_opname(i) for i in ia] == [_opname(i) for i in ib]
    nested, unordered = [], []
    for x, y in zip(ia, ib, strict=True):
        if x.opname in ("MAKE_CELL", "LOAD_CLOSURE"):
            unordered.append((x.argval, y.argval))
        elif x.opname in LOCAL_OPS:
            same_local(x.argval, y.argval)
        elif isinstance(x.argval, types.CodeType):
            nested.append((x.argval, y.argval))
        elif x.opname != "COPY_FREE_VARS" and x.opcode not in dis.hasjabs and x.opcode not in dis.hasjrel:
            assert x.argval == y.argval, (x, y)  # jumps and counts aside: the opcodes around them are compared
    for x, y in nested:
        assert x.co_name == y.co_name or names.get(x.co_name) == y.co_name, (x.co_name, y.co_name)
        x_outer, _, x_own = x.co_qualname.rpartition(".")
        y_outer, _, y_own = y.co_qualname.rpartition(".")  # only a renamed function's own qualname may change ...
        hidden = x.co_name in ("<listcomp>", "<setcomp>", "<dictcomp>")  # ... and a comprehension's, never seen
        assert hidden or x_outer == y_outer, (x.co_qualname, y.co_qualname)
        assert x_own == y_own or names.get(x_own) == y_own, (x.co_qualname, y.co_qualname)
        _compiled_alike(x, y, names, same_local)  # a cell only a nested scope uses is named there
    assert sorted(names[x] for x, _ in unordered) == sorted(y for _, y in unordered)
    assert {names[x] for x in a.co_freevars} == set(b.co_freevars)
    for x in a.co_freevars:
        if bind_outer is not None:
            bind_outer(x, names[x])


def assert_compiles_alike(code: str) -> None:
    """The normalised program compiles exactly when the original does, to the same instructions up to a one-to-one
    renaming of local variables and nested functions."""
    code = ast.unparse(ast.parse(textwrap.dedent(code)))  # layout and comments set aside as before: names only
    try:
        original = compile(code, "p", "exec")
    except SyntaxError:
        with pytest.raises(SyntaxError):
            compile(normalize(code), "p", "exec")
        return
    _compiled_alike(original, compile(normalize(code), "p", "exec"), {})


SAME = {
    "loop and accumulator": (
        "def f(n):\n    total = 0\n    for i in range(n):\n        total += i  # sum\n    return total\n",
        "def f(n):\n    acc = 0\n\n    for k in range(n):\n        acc += k\n    return acc\n",
    ),
    "two locals swapped consistently": (
        "def f(p):\n    a, b = p\n    return a - b\n",
        "def f(p):\n    b, a = p\n    return b - a\n",
    ),
    "comprehension, walrus, with, except, del, match": (
        """
        def f(rows, path):
            best = [r for r in rows if (w := len(r)) > 0]
            with open(path) as fh:
                text = fh.read()
            try:
                value = int(text)
            except ValueError as err:
                value = len(str(err))
            del text
            match best:
                case [first, *rest]:
                    return first, rest, value, w
                case {"k": kv, **more}:
                    return kv, more
            return None
        """,
        """
        def f(rows, path):
            kept = [row for row in rows if (width := len(row)) > 0]
            with open(path) as handle:
                raw = handle.read()
            try:
                n = int(raw)
            except ValueError as problem:
                n = len(str(problem))
            del raw
            match kept:
                case [head, *tail]:
                    return head, tail, n, width
                case {"k": got, **others}:
                    return got, others
            return None
        """,
    ),
    "a closure and a nested helper only ever called": (
        "def f(xs):\n    scale = 2\n    def helper(x):\n        return x * scale\n    return [helper(x) for x in xs]\n",
        "def f(xs):\n    k = 2\n    def times(x):\n        return x * k\n    return [times(y) for y in xs]\n",
    ),
    "the first iterable belongs to the enclosing scope": (
        "def f():\n    x = [1, 2]\n    return [x for x in x]\n",
        "def f():\n    y = [1, 2]\n    return [x for x in y]\n",
    ),
    "a method's locals, the class's attributes kept": (
        "class C:\n    size = 3\n    def m(self):\n        out = self.size\n        return out\n",
        "class C:\n    size = 3\n    def m(self):\n        res = self.size\n        return res\n",
    ),
}

DIFFERENT = {
    "locals' uses swapped": (
        "def f(a, b):\n    x, y = a, b\n    return x - y\n",
        "def f(a, b):\n    x, y = a, b\n    return y - x\n",
    ),
    "a local shadows the global": (
        "x = 1\ndef f():\n    y = 2\n    return x\n",
        "x = 1\ndef f():\n    x = 2\n    return x\n",
    ),
    "a closure reads the outer local, or the global": (
        "a = 10\ndef f():\n    a = 1\n    def g():\n        return a\n    return g()\n",
        "a = 10\ndef f():\n    b = 1\n    def g():\n        return a\n    return g()\n",
    ),
    "a class attribute is no local": (
        "def f():\n    class C:\n        x = 1\n    return C.x\n",
        "def f():\n    class C:\n        y = 1\n    return C.x\n",
    ),
    "a method skips the class body to the function's local": (
        "def f():\n    v = 1\n    class C:\n        v = 2\n        def m(self):\n            return v\n    return C",
        "def f():\n    w = 1\n    class C:\n        v = 2\n        def m(self):\n            return v\n    return C",
    ),
    "parameters are keyword names": (
        "def f(a, b):\n    return a - b\nprint(f(b=1, a=2))\n",
        "def f(b, a):\n    return b - a\nprint(f(b=1, a=2))\n",
    ),
    "lambda parameters are keyword names too": (
        "g = lambda a, b: a - b\nprint(g(b=1, a=2))\n",
        "g = lambda b, a: b - a\nprint(g(b=1, a=2))\n",
    ),
    "global statement": ("def f():\n    global x\n    x = 1\n", "def f():\n    global x\n    y = 1\n"),
    "nonlocal statement": (
        "def f():\n    a = 0\n    def g():\n        nonlocal a\n        a = 1\n    g()\n    return a\n",
        "def f():\n    a = 0\n    def g():\n        nonlocal a\n        b = 1\n    g()\n    return a\n",
    ),
    "a nested function's name is read": (
        "def f():\n    def g():\n        return 1\n    return g.__name__\n",
        "def f():\n    def h():\n        return 1\n    return h.__name__\n",
    ),
    "a class made in a nested function": (
        "def f():\n    def g():\n        class P:\n            pass\n        return P\n    return g().__qualname__\n",
        "def f():\n    def h():\n        class P:\n            pass\n        return P\n    return h().__qualname__\n",
    ),
    "a nested generator function": (
        "def f():\n    def g():\n        yield 1\n    return g().__name__\n",
        "def f():\n    def h():\n        yield 1\n    return h().__name__\n",
    ),
    "a decorated nested function": (
        "def f(reg):\n    @reg\n    def g():\n        return 1\n    return g()\n",
        "def f(reg):\n    @reg\n    def h():\n        return 1\n    return h()\n",
    ),
    "comprehension element": (
        "def f(x):\n    return [x for y in range(3)]\n",
        "def f(x):\n    return [y for y in range(3)]\n",
    ),
    "the walrus binds in the function": (
        "def f():\n    y = 0\n    [(y := v) for v in range(3)]\n    return y\n",
        "def f():\n    y = 0\n    [(z := v) for v in range(3)]\n    return y\n",
    ),
    "a walrus on a comprehension variable does not compile": (
        "def f():\n    return [x := 1 for x in range(3)]\n",
        "def f():\n    return [y := 1 for x in range(3)]\n",
    ),
    "match captures in another order": (
        "def f(p):\n    match p:\n        case [x, y]:\n            return x\n",
        "def f(p):\n    match p:\n        case [y, x]:\n            return x\n",
    ),
    "del makes a name local": (
        "x = 5\ndef f():\n    y = x\n    del y\n    return 1\n",
        "x = 5\ndef f():\n    y = x\n    del x\n    return 1\n",
    ),
    "except-as unbinds its name": (
        "def f():\n    e = 1\n    try:\n        1 / 0\n    except Exception as e:\n        e = 2\n    return e",
        "def f():\n    e = 1\n    try:\n        1 / 0\n    except Exception as err:\n        e = 2\n    return e",
    ),
    "locals() shows the names": (
        "def f():\n    a = 1\n    return locals()\n",
        "def f():\n    b = 1\n    return locals()\n",
    ),
    "eval reads a name": ("def f():\n    a = 1\n    return eval('a')\n", "def f():\n    b = 1\n    return eval('a')\n"),
    "a frame's locals": (
        "import sys\ndef f():\n    a = 1\n    return sys._getframe().f_locals\n",
        "import sys\ndef f():\n    b = 1\n    return sys._getframe().f_locals\n",
    ),
    "an f-string's debug text": (
        "def f():\n    a = 1\n    return f'{a=}'\n",
        "def f():\n    b = 1\n    return f'{b=}'\n",
    ),
    "an annotation's text": (
        "from __future__ import annotations\ndef f():\n    T = int\n    def g(x: T):\n        pass\n    return g\n",
        "from __future__ import annotations\ndef f():\n    U = int\n    def g(x: U):\n        pass\n    return g\n",
    ),
    "an imported name": (
        "def f():\n    import math\n    return math.pi\n",
        "def f():\n    import cmath\n    return cmath.pi\n",
    ),
    "a canonical name already in the program": (
        "_v0 = 5\ndef f():\n    a = 1\n    return _v0\n",
        "_v0 = 5\ndef f():\n    a = 1\n    return a\n",
    ),
}


@pytest.mark.parametrize("pair", SAME.values(), ids=SAME.keys())
def test_programs_equal_up_to_local_names_hash_alike(pair):
    first, second = pair
    assert h(first) == h(second)
    assert_compiles_alike(first)
    assert_compiles_alike(second)


@pytest.mark.parametrize("pair", DIFFERENT.values(), ids=DIFFERENT.keys())
def test_programs_that_differ_only_in_names_but_behave_differently_hash_apart(pair):
    first, second = pair
    assert h(first) != h(second)
    assert_compiles_alike(first)
    assert_compiles_alike(second)


@pytest.mark.parametrize("seed", SEEDS, ids=[p.parent.name for p in SEEDS])
def test_the_shipped_seeds_normalise_to_programs_that_compile_alike(seed):
    assert_compiles_alike(seed.read_text())


_NAMES = st.sampled_from(["a", "b", "x", "y", "i", "j", "acc", "total", "val", "res", "best", "cur", "row", "d2"])
TEMPLATE = """
import math
def solve(points, limit=3):
    {a} = []
    for {b}, ({c}, {d}) in enumerate(points):
        if ({e} := math.hypot({c}, {d})) < limit:
            {a}.append(({e}, {b}))
    def {f}(p):
        return p[0] * len({a})
    return sorted({a}, key=lambda q: {f}(q)), [{b} for {b} in range(limit)]
"""
SLOTS = "abcdef"


@settings(max_examples=40, deadline=None)
@given(st.lists(_NAMES, min_size=len(SLOTS), max_size=len(SLOTS)), st.randoms(use_true_random=False))
def test_any_renaming_of_the_locals_hashes_alike_and_any_merge_apart(names, rnd):
    """One-to-one renamings of the template's locals give the template's hash; names that merge two of its
    variables (a program that behaves differently, or does not run) give another."""
    reference = normalized_hash(TEMPLATE.format(**{s: f"name_{s}" for s in SLOTS}))
    program = TEMPLATE.format(**dict(zip(SLOTS, names, strict=True)))
    assert_compiles_alike(program)
    assert (normalized_hash(program) == reference) == (len(set(names)) == len(SLOTS))
    merged = [*names]
    i, j = rnd.sample(range(len(SLOTS)), 2)
    merged[j] = merged[i]
    assert normalized_hash(TEMPLATE.format(**dict(zip(SLOTS, merged, strict=True)))) != reference
