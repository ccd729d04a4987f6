"""How a candidate shares the CPU with the engine's sampling on the same machine.

The sandbox counts its evaluations in flight (`InFlight`), a value the engine hands to a policy that decodes on
these cores (policies/core_share.py), so that decoding leaves one core to each: llama.cpp's decoding threads
meet at a barrier every step, so one thread that shares its core with a busy process holds all of them
(measured: 26-40 tokens/s fell to 2.8 with one process spinning on a 2-core machine).

A sandbox may also run its candidates at a lower CPU weight (`lower_cpu_weight` before exec, `weight_env` for
the harness's autogroup). A run does not (measured by benchmarks/contention.py: whenever anything else runs
on the machine a candidate at nice 10 gets a tenth of a core, and its time grows several-fold past the goal of
2x, where a wall-clock timeout may cut it; docs/policies.md). Why the autogroup as well as nice: Linux groups
the processes of each session (the kernel's autogroups, on by default) and shares the CPU between the groups
first; a candidate starts a session of its own, so its nice alone changes nothing against the engine (measured
here: 1.17 against 1.16 CPU seconds on a shared core). Setting its autogroup's nice too gives it a tenth of a
contended core (0.2 against 1.39).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

CANDIDATE_NICE = 10  # CFS weight 110 against the engine's 1024: the candidate gets about a tenth when both run
NICE_VARIABLE = "EVOLVE_SANDBOX_NICE"  # read by the harness (sandboxes/harness.py: keep_cpu_weight)


def lower_cpu_weight(nice: int) -> None:
    """Give the calling process at least `nice` (a nice below the current one is left alone: only root may lower
    it). Called between fork and exec; the harness then gives its session's autogroup the same
    (sandboxes/harness.py: keep_cpu_weight), once exec has made its /proc files its own."""
    raise_by = nice - os.getpriority(os.PRIO_PROCESS, 0)
    if raise_by > 0:
        os.nice(raise_by)


def weight_env(nice: int) -> dict[str, str]:
    """What tells the harness to give its session's autogroup `nice` too (none for 0: a sandbox that leaves the
    weight alone leaves the autogroup alone, whatever nice the engine itself runs at)."""
    return {NICE_VARIABLE: str(nice)} if nice > 0 else {}


class InFlight:
    """The number of evaluations running now, counted by the sandbox that runs them (thread-safe)."""

    def __init__(self) -> None:
        self._count = 0
        self._lock = threading.Lock()

    def __call__(self) -> int:
        return self._count

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            self._count += 1
        try:
            yield
        finally:
            with self._lock:
                self._count -= 1


@runtime_checkable
class CountsEvaluations(Protocol):
    """A sandbox whose evaluations run on this machine's cores, and that says how many run now."""

    def evaluations_in_flight(self) -> int: ...
