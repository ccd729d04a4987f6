"""The run control's rules: one stop reason (the first given; Ctrl-C always says so), the evaluation budget
(reserve, release, the seed), when a group may start, and who is told of a cut."""

from __future__ import annotations

import pytest

from evolve.control import RunControl


def test_the_first_reason_stands_and_ctrl_c_overrides_it_once():
    control = RunControl(10)
    control.finish("stalled: 6 groups without a new child")
    control.finish("patience: no new best scalar in 5 evaluations")
    control.budget_spent("time budget reached")
    assert control.reason == "stalled: 6 groups without a new child" and control.stop.is_set()
    assert control.status() == "finished" and not control.abandon
    control.interrupt()
    assert control.reason == "interrupted" and control.abandon and control.interrupted.is_set()
    assert control.status() == "stopped" and control.sampling_cut.is_set()
    with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C
        control.interrupt()


def test_the_budget_is_reserved_released_and_closed_when_abandoned():
    control = RunControl(2)
    assert control.reserve() and control.reserve() and not control.reserve()
    control.release()  # a duplicate stored nothing: its evaluation goes back
    assert control.reserve() and control.reserved == 2
    control.start_from(0)
    control.fail_systemic("5 commit failures in a row (OperationalError: gone)")
    assert not control.reserve()  # queued children stay pending for the resume
    assert control.reserve(force=True) and control.reserved == 1  # the seed is always scored


def test_a_group_may_start_only_within_every_budget():
    elapsed = [0.0]
    control = RunControl(5, max_groups=3, max_time_s=60.0, elapsed_s=lambda: elapsed[0])
    assert control.may_start_group(groups_started=0, queued=4)
    assert not control.may_start_group(groups_started=0, queued=5)  # queued children take the rest of the budget
    assert control.reason == ""  # not a stop: the queue may still shrink
    assert not control.may_start_group(groups_started=3, queued=0)
    assert control.reason == "group budget reached" and not control.stop.is_set()
    fresh = RunControl(5, max_time_s=60.0, elapsed_s=lambda: elapsed[0])
    elapsed[0] = 60.0
    assert not fresh.may_start_group(0, 0) and fresh.reason == "time budget reached"
    halted = RunControl(5)
    halted.finish_generating()
    assert not halted.may_start_group(0, 0) and halted.outcome() == "time budget reached"


def test_a_cut_tells_every_listener_and_a_systemic_failure_keeps_its_first_line():
    control, told = RunControl(5), []
    control.on_cut(lambda: told.append("policy"))
    control.cut_sampling()
    assert told == ["policy"] and control.sampling_cut.is_set() and not control.stop.is_set()
    control.fail_systemic("first")
    control.fail_systemic("second")
    control.finish("target 1.0 reached")
    assert control.outcome() == "stopped: first" and control.status() == "stopped"
    assert control.stop_reason("stopped") == "first"


def test_evaluations_reaching_the_budget_are_the_reason_when_nothing_else_was():
    control = RunControl(3)
    control.counted(2)
    assert control.reason == ""
    control.counted(3)
    assert control.reason == "evaluation budget reached" and control.stop_reason("finished") == control.reason
    assert RunControl(3).stop_reason("failed") == "failed by an error"
