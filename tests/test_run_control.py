"""The run control's rules: one stop reason (the first given; Ctrl-C always says so), the evaluation budget
(reserve, release, the seed, the evaluations read from the ledger), when a group may start (a query), and the cut."""

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
    control.fail_systemic("5 commit failures in a row (OperationalError: gone)")
    assert not control.reserve()  # queued children stay pending for the resume
    assert control.reserve(force=True) and control.reserved == 3  # the seed is always scored
    counted = [7]  # the evaluations the archive holds are read, never copied: the budget counts them as they are
    resumed = RunControl(8, evaluations=lambda: counted[0])
    assert resumed.reserve() and not resumed.reserve() and resumed.reserved == 8
    counted[0] += 1  # the one in flight was stored: counted, and its reservation ends
    resumed.release()
    assert resumed.reserved == 8 and resumed.in_flight == 0


def test_a_group_may_start_only_within_every_budget():
    elapsed = [0.0]
    control = RunControl(5, max_groups=3, max_time_s=60.0, elapsed_s=lambda: elapsed[0])
    assert control.may_start_group(groups_started=0, queued=4)
    assert not control.may_start_group(groups_started=0, queued=5)  # queued children take the rest of the budget
    assert control.reason == ""  # not a stop: the queue may still shrink
    assert not control.may_start_group(groups_started=3, queued=0)
    assert control.group_refusal(3, 0) == "group budget reached"
    assert control.reason == "" and not control.stop.is_set()  # a query writes nothing: the ledger records why
    fresh = RunControl(5, max_time_s=60.0, elapsed_s=lambda: elapsed[0])
    elapsed[0] = 60.0
    assert not fresh.may_start_group(0, 0) and fresh.group_refusal(0, 0) == "time budget reached"
    assert fresh.group_refusal(0, 5) == "time budget reached" and fresh.reason == ""
    halted = RunControl(5)
    halted.finish_generating()
    assert not halted.may_start_group(0, 0) and halted.conclude() == "time budget reached"


def test_a_cut_sets_its_event_and_a_systemic_failure_keeps_its_first_line():
    control = RunControl(5)
    control.cut_sampling()
    assert control.sampling_cut.is_set() and not control.stop.is_set()
    control.fail_systemic("first")
    control.fail_systemic("second")
    control.finish("target 1.0 reached")
    assert control.conclude() == "stopped: first" and control.status() == "stopped"
    assert control.stop_reason("stopped") == "first"


def test_evaluations_reaching_the_budget_are_the_reason_when_nothing_else_was():
    evaluations = [2]
    control = RunControl(3, evaluations=lambda: evaluations[0])
    control.counted()
    assert control.reason == ""
    evaluations[0] = 3
    control.counted()
    assert control.reason == "evaluation budget reached" and control.stop_reason("finished") == control.reason
    assert RunControl(3).stop_reason("failed") == "failed by an error"
