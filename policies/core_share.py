"""How many threads a policy that decodes on this machine's cores uses now: its cores, less one per evaluation
the engine runs on them, never fewer than one.

Why per step rather than once: llama.cpp's decoding threads meet at a barrier at every step, so the step waits
for its slowest thread; a thread whose core a candidate also wants runs at a fraction of its speed and holds
all the others (measured: 26-40 tokens/s fell to 2.8 with one process spinning on a 2-core machine). One
thread fewer while an evaluation runs costs far less than that (decoding is bound by memory, not by cores), and
the core comes back as soon as the evaluation ends.

The count is a value the engine hands over (`EvaluationsInFlight`: a sandbox's count, sandboxes/cpu_share.py);
policies import nothing of the engine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class EvaluationsInFlight(Protocol):
    """How many evaluations run on this machine's cores now."""

    def __call__(self) -> int: ...


def _none() -> int:
    return 0


@dataclass
class CoreShare:
    """`cores` decoding threads at most, one fewer for each evaluation in flight, at least one."""

    cores: int
    in_flight: EvaluationsInFlight = _none
    shared: bool = False  # whether an engine handed a count (for the opening line)

    def threads(self) -> int:
        return max(1, self.cores - self.in_flight())

    def describe(self) -> str:
        if not self.shared:
            return f"{self.cores} threads"
        return f"decoding on the cores evaluations leave free: {self.cores} threads, one fewer per evaluation running"


@runtime_checkable
class SharesCores(Protocol):
    """A policy that decodes on this machine's cores and gives cores back to the evaluations in flight."""

    def share_cores(self, in_flight: EvaluationsInFlight) -> None: ...
