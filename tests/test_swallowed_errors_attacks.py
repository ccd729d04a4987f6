"""Errors the evaluator swallowed (issue #59), against hostile candidates: none can flood, forge or break the
record the sandbox keeps (in the process and the Docker sandbox), a forged record of the wrong shape is bad output,
and after every attack honest programs score their exact vectors with nothing recorded. What is recorded, stored
and shown for honest mistakes is tests/test_swallowed_errors.py's."""

from __future__ import annotations

import pytest

from evolve.problem.outcome import ErrorKind
from sandboxes.reply_shape import malformed
from tests.helpers import hiding_sandbox
from tests.swallowed_cases import EXACT, OWN_MODULE, SEED, simple_form_problem


@pytest.fixture(scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request):
    box = hiding_sandbox(request.param, 2)
    yield box
    box.close()


@pytest.fixture(scope="module")
def simple_problem(tmp_path_factory):
    return simple_form_problem(tmp_path_factory.mktemp("simple"))


# Each tries to flood the record, break it, or forge one; none may get past the bounds or reach another program.
ATTACKS = {
    # its own module's function, handed to stdlib code (threading.Thread.run) that calls it: escapes, a thousand
    "a thousand distinct errors with huge messages": (
        OWN_MODULE + "import threading\n\n"
        "def _raise(k):\n    raise ValueError(str(k) * 200000)\n\n"
        "def solve(x):\n    boom = _me()._raise\n    for k in range(1000 if x == 0 else 0):\n        try:\n"
        "            threading.Thread(target=boom, args=(k,)).run()\n        except ValueError:\n            pass\n"
        "    return x * x\n"
    ),
    "a message whose __str__ raises": (
        "class Bad(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\n\n"
        "def solve(x):\n    raise Bad('hidden')\n"
    ),
    "a message whose __str__ and __repr__ never return": (
        "class Loop(Exception):\n    def __str__(self):\n        while True:\n            pass\n"
        "    __repr__ = __str__\n\n"
        "def solve(x):\n    raise Loop(Loop())\n"
    ),
    "a class name that fakes lines and a metaclass that lies about it": (
        "class Meta(type):\n    @property\n    def __name__(cls):\n        raise RuntimeError('no name')\n\n"
        "Fake = type('Fake\\n- NameError: forged (line 1, 99 times)', (Exception,), {})\n"
        "class Liar(Exception, metaclass=Meta):\n    pass\n\n"
        "def solve(x):\n    raise (Fake if x % 2 else Liar)(b'\\xff\\xfe'.decode('utf-8', 'surrogateescape'))\n"
    ),
    "a fake record printed to stdout and stderr": (
        'import sys\nFAKE = \'{"swallowed": [{"type": "NameError", "message": "forged", "file": null, '
        '"line": 1, "count": 99}]}\'\nprint(FAKE)\nprint(FAKE, file=sys.stderr)\n\n'
        "def solve(x):\n    return x * x\n"
    ),
    "a tracer and the loader put back": (
        "import sys, importlib.machinery, importlib._bootstrap_external as b\nsys.setprofile(None)\n"
        "sys.settrace(None)\nimportlib.machinery.SourceFileLoader.exec_module = b._LoaderBasics.exec_module\n\n"
        "def solve(x):\n    return x * x\n"
    ),
}


def test_floods_and_forgeries_stay_bounded_and_honest_programs_stay_exact(sandbox, simple_problem):
    for name, code in ATTACKS.items():
        outcome = sandbox.evaluate(simple_problem, code)
        assert outcome.error_kind is None, (name, outcome.error_kind, outcome.error)
        assert len(outcome.swallowed) <= 8, name
        for entry in outcome.swallowed:
            assert len(entry.type) <= 100 and len(entry.message) <= 300 and entry.count >= 1, (name, entry)
            assert "\n" not in entry.shown() and entry.shown().encode("utf-8"), (name, entry)
        shown = [e.shown() for e in outcome.swallowed]
        if name.startswith("a thousand"):
            assert len(shown) == 8 and all(e.type == "ValueError" for e in outcome.swallowed), shown
        if name.startswith("a message whose __str__ raises"):
            assert shown == ["Bad: hidden (line 6, 6 times) at `raise Bad('hidden')`"], shown
        if name.startswith("a message whose __str__ and"):
            assert shown == ["Loop: (a message that is not plain text) (line 8, 6 times) at `raise Loop(Loop())`"], (
                shown
            )
        if name.startswith("a class name"):
            assert {e.type for e in outcome.swallowed} == {"Fake - NameError: forged (line 1, 99 times)", "Liar"}
            assert all(e.count == 3 for e in outcome.swallowed), shown
        if name.startswith(("a fake record", "a tracer")):
            assert shown == [], (name, shown)
        for honest, want in (
            (EXACT, {"combined_score": 1.0, "close": 1.0}),
            (SEED, {"combined_score": 0.0, "close": 0.5}),
        ):
            clean = sandbox.evaluate(simple_problem, honest)
            assert (clean.scores, clean.swallowed, clean.error_kind) == (want, [], None), name


def forging(swallowed: str) -> str:
    """A candidate that patches json.dumps so the harness sends its own `swallowed` (Python source)."""
    return (
        "import json\n_real = json.dumps\n\n"
        "def _forged(obj, *args, **kwargs):\n"
        "    if 'default' in kwargs and isinstance(obj, dict):\n"
        f"        obj = {{**obj, 'swallowed': {swallowed}}}\n"
        "    return _real(obj, *args, **kwargs)\n\n"
        "json.dumps = _forged\n\n"
        "def solve(x):\n    return x * x\n"
    )


ENTRY = {"type": "E", "message": "m", "file": None, "line": 1, "code": None, "count": 1}


def entries(**changed: object) -> str:
    """One entry of `swallowed`, as Python source, with `changed` fields (a key of None's value: removed)."""
    return repr([{**ENTRY, **changed}])


FORGED_SWALLOWED = {
    "not a list": '"NameError"',
    "too many entries": f"[{ENTRY!r}] * 9",
    "an entry with an extra key": entries(x=1),
    "a count of zero": entries(count=0),
    "a count that is a boolean": entries(count=True),
    "a line that is text": entries(line="1"),
    "a message that is a list": entries(message=["m"]),
    "code that is a number": entries(code=7),
    "a huge count": f"[{{**{ENTRY!r}, 'count': 10 ** 400}}]",
}


def test_a_forged_swallowed_field_of_the_wrong_shape_is_bad_output(sandbox, simple_problem):
    for name, forged in FORGED_SWALLOWED.items():
        outcome = sandbox.evaluate(simple_problem, forging(forged))
        assert outcome.error_kind == ErrorKind.BAD_OUTPUT and "swallowed" in (outcome.error or ""), name
        assert outcome.swallowed == [] and outcome.scores == {"combined_score": 0.0, "close": 0.0}, name
    # well shaped but huge texts: cut to their caps, the candidate's own record only
    big = "[{'type': 'T' * 10**5, 'message': '\\udcff' + 'M' * 10**5, 'file': 'f' * 10**4, 'line': 1,"
    big += " 'code': 'c' * 10**4, 'count': 7}]"
    outcome = sandbox.evaluate(simple_problem, forging(big))
    [entry] = outcome.swallowed
    assert (len(entry.type), len(entry.message), len(entry.code or ""), entry.count) == (100, 300, 120, 7)
    assert entry.message.encode("utf-8")
    for code, want in ((EXACT, {"combined_score": 1.0, "close": 1.0}),):
        assert (sandbox.evaluate(simple_problem, code).scores, sandbox.evaluate(simple_problem, code).swallowed) == (
            want,
            [],
        )


def test_the_reply_check_names_what_is_wrong_with_swallowed():
    ok = {"scores": {"a": 1.0}, "swallowed": [dict(ENTRY)]}
    assert malformed(ok, None) is None
    assert malformed({**ok, "swallowed": {"a": 1}}, None) == "the reply's swallowed errors are an object, not a list"
    split = {"outputs": {"c0": {"ok": 4}}, "swallowed": [{"type": "E"}]}
    assert "not {type, message, file, line, code, count}" in (malformed(split, ["c0"]) or "")
    crash = {"kind": "crash", "error": "x", "swallowed": [{**ok["swallowed"][0], "line": -1}]}
    assert "line or count" in (malformed(crash, ["c0"]) or "")
