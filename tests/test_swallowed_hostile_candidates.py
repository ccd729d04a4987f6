"""The swallowed-errors recorder (sandboxes/escapes.py) against candidates that try to run their own code inside
it, and the simple form's watcher against an honest program that reads its own function (red team 59).

Each was seen failing before its fix: the recorder found an exception's builtin base with `in` (a metaclass's
`__eq__` then ran and the candidate's `__init__`/`__str__` wrote the message), sliced a class `__name__` that is
a str subclass (its `__getitem__` named the type), and let a KeyboardInterrupt from a candidate's hook out of the
recorder; the watcher handed the evaluator a wrapper with its own `__code__` and `__dict__`."""

from __future__ import annotations

import pytest

from evolve.problem import load_problem
from tests.helpers import hiding_sandbox, write_problem
from tests.swallowed_cases import SEED, SIMPLE_TOML, simple_form_problem

LYING_METACLASS = """
import os
class Meta(type):
    def __eq__(cls, other):
        os.write(2, b"EQ-RAN\\n")
        return other is Exception
    __hash__ = type.__hash__
class E(Exception, metaclass=Meta):
    def __str__(self):
        os.write(2, b"STR-RAN\\n")
        return "FORGED-BY-STR"
def solve(x):
    raise E("boom")
"""
# `type.__name__` may be set to a str subclass, whose own `__getitem__` would run when the recorder cuts the name.
NAME_OF_STR_SUBCLASS = """
class S(str):
    def __getitem__(self, k):
        return "FORGED-BY-GETITEM"
class E(Exception):
    pass
E.__name__ = S("E")
def solve(x):
    raise E("boom")
"""
# The recorder resolves each file of a traceback (`os.path.realpath`) the first time it meets it, its own
# `<_evolve_escapes>` among them: a hook the candidate put there raises KeyboardInterrupt inside the recorder.
# The exception the candidate raised must go on to the evaluator unchanged (which swallows it), and the job end as
# it would have: 3 of 6 right, nothing recorded (a candidate may suppress its own record, docs/sandboxes.md).
INTERRUPTING_HOOK = """
import os.path
_realpath = os.path.realpath
def _hook(path, *args, **kwargs):
    if "escapes" in str(path):
        raise KeyboardInterrupt
    return _realpath(path, *args, **kwargs)
os.path.realpath = _hook
def solve(x):
    if x % 2:
        raise ValueError("odd")
    return x * x
"""
# An honest program that declares its tolerance on its function, and an evaluator that reads it and __code__.
READING_EVALUATOR = """
import importlib.util


def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("candidate", program_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    solve = module.solve
    tol = getattr(solve, "tolerance", 0)  # a program may declare how close it claims to be
    right = sum(abs(solve(x) - x * x) <= tol for x in range(6)) / 6
    return {"combined_score": right, "close": float(solve.__code__.co_argcount == 1)}
"""
HONEST = "def solve(x):\n    return x * x + 1\n\n\nsolve.tolerance = 1\n"


@pytest.fixture(scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request):
    box = hiding_sandbox(request.param, 2)
    yield box
    box.close()


def _problem(form, tmp_path):
    return load_problem(write_problem(tmp_path / "split")) if form == "split" else simple_form_problem(tmp_path / "s")


@pytest.mark.parametrize("form", ["split", "simple"])
def test_a_metaclass_eq_cannot_make_the_recorder_run_the_candidates_str(sandbox, form, tmp_path):
    outcome = sandbox.evaluate(_problem(form, tmp_path), LYING_METACLASS)
    count = 2 if form == "split" else 6  # split: cases c0 and c1; simple: x in range(6)
    assert [e.as_dict() for e in outcome.swallowed] == [
        {"type": "E", "message": "boom", "file": "seed.py", "line": 13, "code": 'raise E("boom")', "count": count}
    ]
    if form == "simple":  # the split form's own case error (traceback.format_exception_only) may call __str__
        assert "STR-RAN" not in outcome.stderr and "EQ-RAN" not in outcome.stderr, outcome.stderr


@pytest.mark.parametrize("form", ["split", "simple"])
def test_a_class_name_of_a_str_subclass_cannot_name_the_record(sandbox, form, tmp_path):
    outcome = sandbox.evaluate(_problem(form, tmp_path), NAME_OF_STR_SUBCLASS)
    count = 2 if form == "split" else 6
    assert [e.as_dict() for e in outcome.swallowed] == [
        {"type": "E", "message": "boom", "file": "seed.py", "line": 9, "code": 'raise E("boom")', "count": count}
    ]


def test_a_keyboard_interrupt_from_a_hook_inside_the_recorder_leaves_the_job_its_normal_outcome(sandbox, tmp_path):
    outcome = sandbox.evaluate(simple_form_problem(tmp_path / "s"), INTERRUPTING_HOOK)
    assert (outcome.scores, outcome.error_kind, outcome.swallowed) == (
        {"combined_score": 0.5, "close": 0.5},
        None,
        [],
    ), (outcome.error, outcome.stderr[-600:])


def test_the_evaluator_sees_the_programs_own_function(sandbox, tmp_path):
    problem = load_problem(write_problem(tmp_path / "p", seed=SEED, evaluate=READING_EVALUATOR, toml=SIMPLE_TOML))
    outcome = sandbox.evaluate(problem, HONEST)
    assert (outcome.scores, outcome.error_kind, outcome.swallowed) == (
        {"combined_score": 1.0, "close": 1.0},
        None,
        [],
    )
