"""Programs whose behaviour depends on a docstring, read by means a tree walk for readers missed (red team 59):
a format string, a metaclass counting the class namespace, unittest's shortDescription, a warning's line number,
and a parent that does not compile until its leading strings are merged. Each child differs from its parent only
in docstrings / bare strings and scores (1.0, 1.0) on the square problem (2 -> 4, 3 -> 9) where the parent scores
less; judged a duplicate, the improvement was never evaluated. All seen failing before evolve/archive/docstrings.py
set strings aside only in text that compiles and spells none of `SUSPECT_SUBSTRINGS` (hash version v5)."""

from __future__ import annotations

import asyncio

import pytest

from evolve.archive.codehash import normalized_hash
from evolve.problem import load_problem
from tests.helpers import hiding_sandbox, write_problem
from tests.test_loop_parts import answer, block, child, wired

PAIRS = {
    # str.format reads the attribute from a string constant that is not exactly "__doc__"
    "str.format reads __doc__": (
        'def solve(x):\n    return x ** (len("{0.__doc__}".format(solve)) - 3)\n',
        'def solve(x):\n    """Squar"""\n    return x ** (len("{0.__doc__}".format(solve)) - 3)\n',
    ),
    # a metaclass sees the class namespace, which holds '__doc__' when the class has a docstring
    "a metaclass counts the class namespace": (
        "class M(type):\n    def __new__(m, n, b, ns):\n        c = super().__new__(m, n, b, ns)\n"
        "        c.n = len(ns)\n        return c\n\n\nclass A(metaclass=M):\n    pass\n\n\n"
        "class B(metaclass=M):\n    pass\n\n\ndef solve(x):\n    return x ** (1 + A.n - B.n)\n",
        "class M(type):\n    def __new__(m, n, b, ns):\n        c = super().__new__(m, n, b, ns)\n"
        '        c.n = len(ns)\n        return c\n\n\nclass A(metaclass=M):\n    """Two."""\n\n\n'
        "class B(metaclass=M):\n    pass\n\n\ndef solve(x):\n    return x ** (1 + A.n - B.n)\n",
    ),
    # unittest's shortDescription() is the first line of the function's docstring
    "unittest.FunctionTestCase.shortDescription": (
        "import unittest\n\n\ndef solve(x):\n"
        '    return x ** len(unittest.FunctionTestCase(solve).shortDescription() or "")\n',
        'import unittest\n\n\ndef solve(x):\n    """ab"""\n'
        '    return x ** len(unittest.FunctionTestCase(solve).shortDescription() or "")\n',
    ),
    # a docstring moves the lines below it, and warnings (like logging's %(lineno)d) report line numbers
    "a warning's line number": (
        "import warnings\n\n\ndef solve(x):\n"
        "    with warnings.catch_warnings(record=True) as seen:\n"
        '        warnings.simplefilter("always")\n        warnings.warn("where")\n'
        "    return x ** (seen[0].lineno - 6)\n",
        'import warnings\n\n\ndef solve(x):\n    """Square."""\n'
        "    with warnings.catch_warnings(record=True) as seen:\n"
        '        warnings.simplefilter("always")\n        warnings.warn("where")\n'
        "    return x ** (seen[0].lineno - 6)\n",
    ),
    # only a docstring may precede `from __future__`: the parent is a SyntaxError, the child that merges its two
    # leading strings into one docstring is the fix
    "a second leading string before a __future__ import": (
        '"""Square."""\n"More."\nfrom __future__ import annotations\n\n\ndef solve(x):\n    return x * x\n',
        '"""Square. More."""\nfrom __future__ import annotations\n\n\ndef solve(x):\n    return x * x\n',
    ),
}


@pytest.fixture(scope="module")
def box():
    sandbox = hiding_sandbox("process", 2)
    yield sandbox
    sandbox.close()


@pytest.mark.parametrize("pair", PAIRS.values(), ids=PAIRS.keys())
def test_a_docstring_the_program_reads_keeps_it_apart_from_its_parent(pair, box, tmp_path):
    parent, improved = pair
    problem = load_problem(write_problem(tmp_path / "square"))
    parent_scores = box.evaluate(problem, parent).scores
    assert box.evaluate(problem, improved).scores == {"c0": 1.0, "c1": 1.0}
    assert parent_scores != {"c0": 1.0, "c1": 1.0}  # they behave differently in the real sandbox...
    assert normalized_hash(parent) != normalized_hash(improved)  # ...so they must not be one program


def test_through_the_loop_the_improvement_is_evaluated_not_dropped_as_a_duplicate(tmp_path):
    """The metaclass pair through the search loop: the parent is stored, the completion offers the improved child."""
    parent, improved = PAIRS["a metaclass counts the class namespace"]
    loop = wired(tmp_path, [answer(improved)], group_size=1, variants=1)
    try:

        async def one_group():
            seed = await loop.evaluator.score_seed(child(block(parent), None))
            await loop.flow.commit([seed])
            return await loop.group(0, loop.members[0], loop.members[0].base)

        group = asyncio.run(one_group())
        assert group is not None and group.statuses == {"ok": 1}, group and group.statuses
        assert [c.code for c in group.children] == [block(improved)]
    finally:
        loop.sandbox.close()
        loop.archive.close()
