"""Docstrings in the code hash: a child that differs from a known program only in its docstrings (or in strings
used as comments) is a duplicate and is not evaluated; a program that can read `__doc__` keeps them, since two
such programs may behave differently."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from evolve.archive.codehash import normalized_hash
from tests.helpers import SQUARE_SEED
from tests.test_loop_parts import answer, block, child, wired


def h(code: str) -> str:
    return normalized_hash(textwrap.dedent(code))


def test_a_child_that_only_adds_docstrings_is_a_duplicate_and_is_not_evaluated(tmp_path):
    """Through the loop: the seed is stored; a completion rewrites it with a docstring (and a string used as a
    comment) and offers one new program; only the new program is evaluated and comes back as a child."""
    documented = 'def solve(x):\n    """Add one: the seed."""\n    \'a string as a comment\'\n    return x + 1\n'
    new = "def solve(x):\n    return x * x\n"
    loop = wired(tmp_path, [answer(documented, new)], group_size=1, variants=2)
    try:

        async def one_group():
            seed = await loop.evaluator.score_seed(child(SQUARE_SEED, None))
            await loop.flow.commit([seed])
            return await loop.group(0, loop.members[0], loop.members[0].base)

        group = asyncio.run(one_group())
        assert group is not None and group.statuses == {"duplicate": 1, "ok": 1}
        assert [c.code for c in group.children] == [block(new)]
    finally:
        loop.sandbox.close()
        loop.archive.close()


SAME = {
    "a function's docstring": (
        "def f(x):\n    return x + 1\n",
        'def f(x):\n    """Add one."""\n    return x + 1\n',
    ),
    "module and class docstrings, and one that differs": (
        '"""Module one."""\nclass C:\n    """A class."""\n    k = 1\n',
        '"""Module two, longer."""\nclass C:\n    k = 1\n',
    ),
    "a body of only a docstring is a body of pass": (
        "def f():\n    pass\nclass E(Exception):\n    pass\n",
        'def f():\n    """Nothing yet."""\nclass E(Exception):\n    """Raised when."""\n',
    ),
    "a string used as a comment mid-body": (
        "def f(x):\n    y = x * 2\n    return y\n",
        'def f(x):\n    y = x * 2\n    """Now return the double."""\n    return y\n',
    ),
}


@pytest.mark.parametrize("pair", SAME.values(), ids=SAME.keys())
def test_programs_equal_up_to_docstrings_hash_alike(pair):
    first, second = pair
    assert h(first) == h(second)
    for code in pair:
        exec(compile(code, "p", "exec"), {})  # both run: the pairs are programs, not fragments


DIFFERENT = {
    "a function reads its own __doc__": (
        'def f():\n    """one"""\n    return f.__doc__\n',
        'def f():\n    """two"""\n    return f.__doc__\n',
    ),
    "the module docstring as a global": (
        '"""one"""\ndef f():\n    return __doc__\n',
        '"""two"""\ndef f():\n    return __doc__\n',
    ),
    "through globals()": (
        '"""one"""\ndef f():\n    return globals()["__d" + "oc__"]\n',
        '"""two"""\ndef f():\n    return globals()["__d" + "oc__"]\n',
    ),
    "through a built-up getattr": (
        'def f():\n    """one"""\n    return getattr(f, "__d" + "oc__")\n',
        'def f():\n    """two"""\n    return getattr(f, "__d" + "oc__")\n',
    ),
    "through inspect.getdoc": (
        'import inspect\ndef f():\n    """one"""\n    return inspect.getdoc(f)\n',
        'import inspect\ndef f():\n    """two"""\n    return inspect.getdoc(f)\n',
    ),
    "through a class's __dict__": (
        'class C:\n    """one"""\ndef f():\n    return C.__dict__["__d" + "oc__"]\n',
        'class C:\n    """two"""\ndef f():\n    return C.__dict__["__d" + "oc__"]\n',
    ),
    "doctest runs them": (
        'import doctest\ndef f():\n    """>>> 1\n    1\n    """\n',
        'import doctest\ndef f():\n    """>>> 1\n    2\n    """\n',
    ),
}


@pytest.mark.parametrize("pair", DIFFERENT.values(), ids=DIFFERENT.keys())
def test_a_program_that_can_read_its_docstrings_keeps_them(pair):
    first, second = pair
    assert h(first) != h(second)


def test_a_string_that_is_not_a_bare_statement_stays():
    """Only bare string statements go: a string assigned, returned or in an f-string is part of what runs."""
    assert h('def f():\n    s = "a"\n    return s\n') != h('def f():\n    s = "b"\n    return s\n')
    assert h('def f():\n    return "a"\n') != h('def f():\n    return "b"\n')
    assert h('def f(x):\n    f"{x.g()}"\n    return x\n') != h("def f(x):\n    return x\n")
