"""Run control: why a run stops, Ctrl-C, cutting the group being sampled, and the evaluation budget, in one place.

The ledger asks it whether a group may start (`group_refusal`, a query) and takes an evaluation from the budget
(`reserve`), gives back what stored nothing (`release`), and says when a goal is reached (`finish`,
`cut_sampling`). The stop reason has one writer, so the first reason given is the one the run reports (Ctrl-C
excepted: it always says "interrupted", and why when a policy update was abandoned).

It is part of the run's ledger (evolve/ledger.py), which alone calls its commands, on the loop's thread (the
signal handler asks the ledger to `interrupt`). Stages are handed `signals`, read-only views of its events
(`StopSignals`: they may ask and wait, never set), never the object itself nor one of its bound methods;
tests/test_ledger_writers.py reads the code to keep it so. Its queries (`group_refusal`, `may_start_group`,
`reserved`, `status`, `stop_reason`) write nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

UPDATE_ABANDONED = (
    "interrupted during a policy update: the update was abandoned (no version saved); "
    "run the same command to resume, and it trains again after its next group"
)


@dataclass(frozen=True)
class StopSignal:
    """One of the run's events as a stage sees it: it may ask it (`is_set`) and wait on it (`wait`), never set nor
    clear it, so only the run's control (through its ledger) says when sampling stops."""

    is_set: Callable[[], bool]
    wait: Callable[[], Awaitable[object]]

    @classmethod
    def of(cls, event: asyncio.Event) -> StopSignal:
        return cls(event.is_set, event.wait)


@dataclass(frozen=True)
class StopSignals:
    """What the stages stop on, read-only: the sampling cut and Ctrl-C as events to wait on (on the event loop),
    and Ctrl-C as a check a worker thread may ask (the parser between variants, the trainer between samples).
    None of them leads back to the `RunControl`: a bound method of it would (its `__self__`)."""

    cut: StopSignal
    interrupted: StopSignal
    interrupt_requested: Callable[[], bool]


class RunControl:
    """The stop state and the evaluation budget of one session of a run."""

    def __init__(
        self,
        max_evaluations: int,
        *,
        max_groups: int | None = None,
        max_time_s: float | None = None,
        elapsed_s: Callable[[], float] = lambda: 0.0,
        evaluations: Callable[[], int] = lambda: 0,
    ) -> None:
        """`evaluations`: how many the archive holds (the ledger's count, read here, never kept twice)."""
        self.max_evaluations, self.max_groups, self.max_time_s = max_evaluations, max_groups, max_time_s
        self._elapsed_s, self._evaluations = elapsed_s, evaluations
        self.stop = asyncio.Event()  # no further group starts; what is queued is still evaluated unless abandoned
        self.interrupted = asyncio.Event()  # Ctrl-C: a generation in flight is abandoned too
        self._interrupted_seen = threading.Event()  # the same, for worker threads: a policy update between samples
        self.sampling_cut = asyncio.Event()  # Ctrl-C or the goal reached: no group in flight is stored
        self.signals = StopSignals(
            StopSignal.of(self.sampling_cut), StopSignal.of(self.interrupted), self._interrupted_seen.is_set
        )
        self.no_more_groups = False  # finish_generating(): no group starts, what is queued is evaluated
        self.abandon = False  # leave queued children pending (Ctrl-C, systemic failure)
        self.systemic: str | None = None  # the one line that stopped the run, when a failure repeated
        self.in_flight = 0  # evaluations taken from the budget and not yet counted or given back
        self._reason = ""

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

    def cut_sampling(self) -> None:
        """End the groups being sampled (they are not stored) instead of waiting for children past the goal; the
        policy calls in flight wait on `sampling_cut` (evolve/policy_calls.py) and stop."""
        self.sampling_cut.set()

    # ---- the evaluation budget --------------------------------------------------------------------------
    @property
    def reserved(self) -> int:
        """Evaluations the archive holds plus those in flight: what the budget is measured against."""
        return self._evaluations() + self.in_flight

    def reserve(self, *, force: bool = False) -> bool:
        """Take one evaluation from the budget; False (nothing taken) once it is spent or the run abandons its
        queue. `force`: the seed, which is always scored."""
        if not force and (self.abandon or self.reserved >= self.max_evaluations):
            return False
        self.in_flight += 1
        return True

    def release(self, count: int = 1) -> None:
        """End reservations: their evaluations were counted, or stored nothing (aborted, duplicates, a failed
        commit) and go back to the budget."""
        self.in_flight -= count

    def counted(self) -> None:
        """The archive's evaluations changed: record the budget as the reason once they reach it."""
        if self._evaluations() >= self.max_evaluations:
            self.budget_spent("evaluation budget reached")

    def group_refusal(self, groups_started: int, queued: int) -> str | None:
        """Why no further group may start (time, evaluations counting queued children, the group budget), or None
        when one may. "" when the refusal needs no reason of its own (stopped already, or the queue holds the rest
        of the budget: it may still shrink). A query: the ledger records a returned reason (`budget_spent`)."""
        if self.no_more_groups:
            return ""
        if self.max_groups is not None and groups_started >= self.max_groups:
            return "group budget reached"
        if self.stop.is_set():
            return ""
        if self.max_time_s is not None and self._elapsed_s() >= self.max_time_s:
            return "time budget reached"
        if self.reserved + queued >= self.max_evaluations:
            return ""
        return None

    def may_start_group(self, groups_started: int, queued: int) -> bool:
        """Budget left for another group (a query; see `group_refusal`)."""
        return self.group_refusal(groups_started, queued) is None

    # ---- how the session ended --------------------------------------------------------------------------
    def conclude(self) -> str:
        """What `run()` returns once the session's work is done; the evaluation budget is the reason when no other
        was given (a command: it settles the reason)."""
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
