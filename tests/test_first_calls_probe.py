"""The probe the seed's job ships (sandboxes/first_calls.py), run here on real modules loaded from real files: the
first call of each named function from outside the editable blocks, shown as written, bounded in work and length;
the function put back after it, so the rest of the evaluation pays nothing (a profile hook had slowed a seed 3.5
times, and the run takes its timeout rule from the seed's time)."""

from __future__ import annotations

import collections
import importlib.util
from pathlib import Path

import pytest

from sandboxes.first_calls import CALL_CAP, CALLS_FROM_BLOCKS, FirstCalls

PROGRAM = """# EVOLVE-BLOCK-START
def priority(job, *extra, weight=1.0, **named):
    return weight


def helper(jobs):
    return [priority(j) for j in jobs]  # the editable code's own calls: not the interface
# EVOLVE-BLOCK-END


def schedule(jobs):
    helper(jobs)
    return sorted(range(len(jobs)), key=lambda i: priority(dict(jobs[i])))
"""
BLOCK_LINES = [[1, 8]]


class Loud:
    """An argument whose repr must not run: it would take the seed's time (or memory) with it."""

    reprs = 0

    def __repr__(self) -> str:
        Loud.reprs += 1
        return "x" * 10**7


def _loaded(tmp_path: Path, probe: FirstCalls, code: str = PROGRAM):
    path = tmp_path / "seed.py"
    path.write_text(code)
    spec = importlib.util.spec_from_file_location("seed_under_probe", path)
    module = importlib.util.module_from_spec(spec)
    probe.start()
    try:
        spec.loader.exec_module(module)  # the loader the harness and evaluators use: watched while started
    finally:
        probe.stop()
    return module


def _probe(tmp_path: Path, names=("priority",)) -> FirstCalls:
    return FirstCalls(list(names), str(tmp_path / "seed.py"), BLOCK_LINES)


def test_the_fixed_code_s_first_call_is_shown_as_written_and_the_function_put_back(tmp_path):
    probe = _probe(tmp_path, ("priority", "absent", "priority"))
    module = _loaded(tmp_path, probe)
    original = module.priority.__wrapped__
    assert module.schedule([{"time": 3, "due": 9}, {"time": 1}]) == [0, 1]
    assert probe.entries() == ["priority({'time': 3, 'due': 9})"]  # not the helper's call; keys in their order
    assert module.priority is original  # the rest of the evaluation calls the function itself
    module.schedule([{"time": 5}])
    assert probe.entries() == ["priority({'time': 3, 'due': 9})"]  # the first call stands


def test_an_evaluator_s_call_through_the_module_counts_with_its_keywords(tmp_path):
    probe = _probe(tmp_path)
    module = _loaded(tmp_path, probe)
    module.priority([0] * 10_000, "x" * 10_000, weight=2.0, note={"deep": {"deeper": {"deepest": {"at": 1}}}})
    [call] = probe.entries()
    assert call == (
        "priority([0, 0, 0, 0, 0, 0, ...], 'xxxxxxxxxxxxxxxxxxxxxxxxxxx...xxxxxxxxxxxxxxxxxxxxxxxxxxxx', "
        "weight=2.0, note={'deep': {'deeper': {'deepest': {...}}}})"
    )
    assert len(call) <= CALL_CAP


def test_arguments_are_shown_without_running_their_repr_and_on_one_line(tmp_path):
    probe = _probe(tmp_path)
    module = _loaded(tmp_path, probe)
    Loud.reprs = 0
    counts = collections.Counter(range(10**6))
    module.priority(Loud(), counts, b"ab" * 10**6, object(), "two\nlines `and` ticks", [[1], (2,)])
    assert Loud.reprs == 0
    assert probe.entries() == [
        "priority(<Loud>, {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1, ...}, "
        + repr(b"ab" * 30)
        + "..., <object>, 'two\\nlines 'and' ticks', [[1], (2,)])"
    ]


def test_calls_from_the_editable_code_are_not_the_interface_and_give_up_in_bounded_time(tmp_path):
    probe = _probe(tmp_path)
    module = _loaded(tmp_path, probe)
    module.helper([{"time": 1}] * (CALLS_FROM_BLOCKS + 5))  # the block's own calls only
    assert probe.entries() == []
    assert not hasattr(module.priority, "__wrapped__")  # put back, unseen: later calls pay nothing


def test_modules_not_loaded_from_the_program_s_file_are_left_alone(tmp_path):
    probe = FirstCalls(["priority"], str(tmp_path / "elsewhere.py"), BLOCK_LINES)
    module = _loaded(tmp_path, probe)
    assert not hasattr(module.priority, "__wrapped__")
    module.schedule([{"time": 1}])
    assert probe.entries() == []


@pytest.mark.parametrize("names", [(), ("absent",)])
def test_a_probe_with_nothing_to_record_changes_nothing(tmp_path, names):
    probe = _probe(tmp_path, names)
    module = _loaded(tmp_path, probe)
    assert module.schedule([{"time": 2}, {"time": 1}]) == [0, 1]
    assert probe.entries() == [] and not hasattr(module.priority, "__wrapped__")
