"""Run control: why a run stops, Ctrl-C, cutting the group being sampled, and the evaluation budget, in one place.

The ledger asks it whether a group may start and a child may be evaluated (`reserve`), gives back what stored
nothing (`release`), and says when a goal is reached (`finish`, `cut_sampling`). The stop reason has one writer, so
the first reason given is the one the run reports (Ctrl-C excepted: it always says "interrupted", and why when a
policy update was abandoned).

It is part of the run's ledger (evolve/ledger.py), which alone changes it, on the loop's thread; the signal
handler's `interrupt` runs there too, and worker threads only read (`interrupt_requested`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

UPDATE_ABANDONED = (
    "interrupted during a policy update: the update was abandoned (no version saved); "
    "run the same command to resume, and it trains again after its next group"
)


class RunControl:
    """The stop state and the evaluation budget of one session of a run."""

    def __init__(
        self,
        max_evaluations: int,
        *,
        max_groups: int | None = None,
        max_time_s: float | None = None,
        elapsed_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.max_evaluations, self.max_groups, self.max_time_s = max_evaluations, max_groups, max_time_s
        self._elapsed_s = elapsed_s
        self.stop = asyncio.Event()  # no further group starts; what is queued is still evaluated unless abandoned
        self.interrupted = asyncio.Event()  # Ctrl-C: a generation in flight is abandoned too
        self._interrupted_seen = threading.Event()  # the same, for worker threads: a policy update between samples
        self.sampling_cut = asyncio.Event()  # Ctrl-C or the goal reached: no group in flight is stored
        self.no_more_groups = False  # finish_generating(): no group starts, what is queued is evaluated
        self.abandon = False  # leave queued children pending (Ctrl-C, systemic failure)
        self.systemic: str | None = None  # the one line that stopped the run, when a failure repeated
        self.reserved = 0  # evaluations committed plus those in flight
        self._reason = ""
        self._on_cut: list[Callable[[], None]] = []

    # ---- the stop reason (its one writer is `_settle`) --------------------------------------------------
    @property
    def reason(self) -> str:
        return self._reason

    def _settle(self, reason: str, *, overrides: bool = False) -> None:
        if overrides or not self._reason:
            self._reason = reason

    def finish(self, reason: str) -> None:
        """Stop starting groups; queued children are still evaluated."""
        self._settle(reason)
        self.stop.set()

    def budget_spent(self, reason: str) -> None:
        """A budget ran out: the reason is recorded, and the rule that found it keeps refusing by itself."""
        self._settle(reason)

    def interrupt(self) -> None:
        """Ctrl-C (or SIGTERM): stop now, leave queued children pending, cut the group being sampled. A second
        one raises `KeyboardInterrupt`."""
        if self.interrupted.is_set():
            raise KeyboardInterrupt
        self._settle("interrupted", overrides=True)
        self.abandon = True
        self.stop.set()
        self._interrupted_seen.set()
        self.interrupted.set()
        self.cut_sampling()

    def interrupt_requested(self) -> bool:
        """Whether Ctrl-C or SIGTERM came; safe to ask from any thread (the trainer asks between samples)."""
        return self._interrupted_seen.is_set()

    def update_abandoned(self) -> None:
        """The stop came during a policy update, which was given up: the reason says so (still an interruption)."""
        self._settle(UPDATE_ABANDONED, overrides=True)

    def fail_systemic(self, line: str) -> None:
        """A failure repeated: stop at once, leaving queued children pending; the first such line is kept."""
        if self.systemic is None:
            self.systemic = line
            self.abandon = True
            self.stop.set()

    def finish_generating(self) -> None:
        """Start no further group; what is generated still gets evaluated. Fixed-time benchmark runs call it when
        their time is up, so the reason says so (it read "evaluation budget reached", which was not the cause)."""
        self.no_more_groups = True
        self.budget_spent("time budget reached")

    def on_cut(self, listener: Callable[[], None]) -> None:
        """Call `listener` whenever sampling is cut (an in-process policy is told to stop between tokens)."""
        self._on_cut.append(listener)

    def cut_sampling(self) -> None:
        """End the groups being sampled (they are not stored) instead of waiting for children past the goal."""
        self.sampling_cut.set()
        for listener in self._on_cut:
            listener()

    # ---- the evaluation budget --------------------------------------------------------------------------
    def start_from(self, evaluations: int) -> None:
        """A session starts with the evaluations the archive already holds counted against the budget."""
        self.reserved = evaluations

    def reserve(self, *, force: bool = False) -> bool:
        """Take one evaluation from the budget; False (nothing taken) once it is spent or the run abandons its
        queue. `force`: the seed, which is always scored."""
        if not force and (self.abandon or self.reserved >= self.max_evaluations):
            return False
        self.reserved += 1
        return True

    def release(self, count: int = 1) -> None:
        """Give back evaluations that stored nothing (aborted, duplicates, a failed commit)."""
        self.reserved -= count

    def counted(self, evaluations: int) -> None:
        """The archive holds `evaluations` now: record the budget as the reason once they reach it."""
        if evaluations >= self.max_evaluations:
            self.budget_spent("evaluation budget reached")

    def budget_left(self) -> bool:
        if self.stop.is_set():
            return False
        if self.max_time_s is not None and self._elapsed_s() >= self.max_time_s:
            self.budget_spent("time budget reached")
            return False
        return self.reserved < self.max_evaluations

    def may_start_group(self, groups_started: int, queued: int) -> bool:
        """Budget left for another group: time, evaluations (counting queued children), and the group budget."""
        if self.no_more_groups:
            return False
        if self.max_groups is not None and groups_started >= self.max_groups:
            self.budget_spent("group budget reached")
            return False
        return self.budget_left() and self.reserved + queued < self.max_evaluations

    # ---- how the session ended --------------------------------------------------------------------------
    def outcome(self) -> str:
        """What `run()` returns once the session's work is done."""
        if self.systemic:
            return f"stopped: {self.systemic}"
        self._settle("evaluation budget reached")
        return self._reason

    def status(self) -> str:
        """The run's status for a session that ended by itself: `stopped` when it may be resumed to go on."""
        return "stopped" if self.interrupted.is_set() or self.systemic else "finished"

    def stop_reason(self, status: str) -> str:
        """The line stored with the run."""
        return self.systemic or self._reason or f"{status} by an error"


class StageFailure(Exception):
    """An unexpected exception at one stage of one group or child; it costs that group or child only."""

    def __init__(self, stage: str, exc: BaseException) -> None:
        super().__init__(f"{stage}: {type(exc).__name__}: {exc}")
        self.stage, self.exc = stage, exc
