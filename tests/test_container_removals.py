"""Removals of destroyed containers may be waited for by one slot while another slot destroys (a CI failure).

Each pool slot runs in its own thread: one slot's `close()` (a new problem) waits for every removal while another
slot's `destroy()` starts one. A removal listed before it was started could be joined in that gap, and the
waiting slot then raised `cannot join thread before it is started`, which the pool reported as a refused sandbox.
The container here stands in for the daemon's only: the race is in the engine's own thread bookkeeping, and a
real daemon makes the gap too rare to hit on demand.
"""

from __future__ import annotations

import sys
import threading
import time

import pytest

from sandboxes import warm_container


class _SlowRemoval:
    """A container the daemon takes a millisecond to remove."""

    removed = 0

    def kill(self) -> None:
        pass

    def remove(self, force: bool, v: bool) -> None:
        time.sleep(0.001)
        _SlowRemoval.removed += 1


class _Closed:
    def close(self) -> None:
        pass


def _destroyed_container() -> None:
    box = warm_container.WarmContainer.__new__(warm_container.WarmContainer)
    box.container, box._channel, box._attach = _SlowRemoval(), _Closed(), _Closed()
    box.destroy()


@pytest.fixture
def tight_thread_switching():
    """Switch threads every microsecond, so the gap between listing a removal and starting it is hit often."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_waiting_for_removals_while_another_slot_destroys_never_joins_an_unstarted_removal(tight_thread_switching):
    errors: list[BaseException] = []
    destroyed = threading.Event()
    _SlowRemoval.removed = 0

    def destroy_many() -> None:
        for _ in range(1500):
            _destroyed_container()
        destroyed.set()

    def wait_until_destroyed() -> None:
        while not destroyed.is_set():
            try:
                warm_container.wait_for_removals(5)
            except RuntimeError as exc:
                errors.append(exc)

    slots = [threading.Thread(target=destroy_many), threading.Thread(target=wait_until_destroyed)]
    for slot in slots:
        slot.start()
    for slot in slots:
        slot.join(timeout=60)
    warm_container.wait_for_removals(30)
    assert errors == []
    assert _SlowRemoval.removed == 1500  # every removal ran to its end, and was waited for


class _TakesItsTime(_SlowRemoval):
    def remove(self, force: bool, v: bool) -> None:
        time.sleep(0.3)
        _SlowRemoval.removed += 1


def test_two_slots_waiting_at_once_each_wait_for_every_removal():
    _SlowRemoval.removed = 0
    box = warm_container.WarmContainer.__new__(warm_container.WarmContainer)
    box.container, box._channel, box._attach = _TakesItsTime(), _Closed(), _Closed()
    box.destroy()
    removed_when_done: list[int] = []

    def wait() -> None:
        warm_container.wait_for_removals(10)
        removed_when_done.append(_SlowRemoval.removed)

    slots = [threading.Thread(target=wait) for _ in range(2)]
    for slot in slots:
        slot.start()
    for slot in slots:
        slot.join(timeout=30)
    assert removed_when_done == [1, 1]  # neither returned while the removal the other was joining still ran
