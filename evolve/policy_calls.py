"""Calling the policy from the loop: a group's completions that Ctrl-C or a reached goal can cut short, and the
archive row of the policy version that wrote them; `PolicyMember` bundles both for one member of the ensemble.

An HTTP policy (`AsyncPolicy`) is awaited on the event loop and cancelled on a cut; an in-process one runs in a
daemon thread and is told to stop between tokens, but only while one of its calls is in flight (a request that
found none would end its next, unrelated call). Both wait on signals they are handed (`StopSignal`: the run's
`sampling_cut` and `interrupted`, read-only): a stage holds no part of the run's ledger, sets none of its events
and registers nowhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from evolve.archive import Archive
from evolve.ask_arms import Ask
from evolve.control import StopSignal
from evolve.interrupt import cancel_on, until_interrupted
from policies.policy import AsyncPolicy, Generated, Interruptible, Policy, PolicyError, SamplingParams

# A member's training step (`ArchiveTrainer.step`), called with the run's "should the update stop?" check, which
# it asks between samples: a stop then raises `policies.trainer.UpdateAbandoned` within one sample's pass.
TrainStep = Callable[[Callable[[], bool]], Any]


class PolicyCalls:
    """Sampling that stops when the run cuts it (`cut`: Ctrl-C, the goal reached, the time spent) and stops being
    waited for on Ctrl-C (`interrupted`); both are read-only views of the run's events, set by its ledger alone."""

    def __init__(self, policy: Policy, cut: StopSignal, interrupted: StopSignal) -> None:
        self.policy, self.cut, self.interrupted = policy, cut, interrupted
        self.in_flight = 0  # policy calls under way
        self.abandoned = False  # Ctrl-C stopped waiting for a call whose thread may still be in a forward pass

    def interrupt(self) -> None:
        """Tell an in-process policy to stop between tokens, only while a call is in flight; HTTP calls are
        cancelled through `cut`."""
        if self.in_flight and isinstance(self.policy, Interruptible) and not isinstance(self.policy, AsyncPolicy):
            self.policy.interrupt()

    async def _interrupt_on_cut(self) -> None:
        """Waits beside one in-process call, and tells the policy to stop once the cut comes (cancelled when the
        call ends first)."""
        await self.cut.wait()
        self.interrupt()

    async def sample(self, prompt: str, params: SamplingParams, n: int) -> list[Generated] | None:
        """The group's completions; None when Ctrl-C came first (the call is abandoned, not waited for) or the
        goal was reached (an HTTP call is cancelled; an in-process one ends at its next token)."""
        cut = self.cut
        if cut.is_set():
            return None
        self.in_flight += 1
        watcher = None
        try:
            if isinstance(self.policy, AsyncPolicy):  # HTTP policies: many groups in flight at once
                return await cancel_on(cut, self.policy.agenerate(prompt, params, n))
            watcher = asyncio.ensure_future(self._interrupt_on_cut())
            try:
                group = await until_interrupted(self.interrupted, self.policy.generate, prompt, params, n)
            except Exception:
                self._withdraw_unseen_interrupt(None)
                raise
            if group is not None:  # None: abandoned on Ctrl-C; the policy's thread consumes the request itself
                self._withdraw_unseen_interrupt(group)
                self._check_not_interrupted_uncut(group)
            else:
                self.abandoned = True
            return group
        finally:
            self.in_flight -= 1
            if watcher is not None:
                watcher.cancel()

    def _check_not_interrupted_uncut(self, group: list[Generated]) -> None:
        """Only the cut sends an interrupt, so a call that came back interrupted without one is a fault of the
        policy (a request left over from an earlier search on the same object): an incident that costs this
        group, never a silent "cut" (the loop would start the next group at once, and spin on a stuck policy)."""
        if not self.cut.is_set() and any(c.finish_reason == "interrupted" for c in group):
            raise PolicyError(
                f"{type(self.policy).__name__} ended a group as interrupted although the run did not cut it"
            )

    def _withdraw_unseen_interrupt(self, group: list[Generated] | None) -> None:
        """A call that came back (or raised) after the cut without honouring it had ended before it looked: the
        request it was sent is still set and would end the policy's next, unrelated call, so withdraw it. The
        cut is the only sender during a call: `interrupt` runs only once `sampling_cut` is set."""
        if not self.cut.is_set() or not isinstance(self.policy, Interruptible):
            return
        if not (group and any(c.finish_reason == "interrupted" for c in group)):
            self.policy.withdraw_interrupt()


class PolicyVersions:
    """Policy version number → its `PolicyVersion` row id in the member's lineage, inserting a row the first time
    one serves. Each member of an ensemble has its own lineage (rows named after it); rows that name no member
    come from archives older than ensembles and belong to the run's first member (`first`)."""

    def __init__(self, archive: Archive, run_id: int, policy: Policy, member: str = "", first: bool = True) -> None:
        self.archive, self.run_id, self.policy = archive, run_id, policy
        self.member, self.first = member or policy.name, first
        self._rows: dict[int, int] = {}

    def serving(self) -> int:
        """The row id of the version now serving."""
        number = self.policy.version
        if number not in self._rows:
            rows = self.archive.policy_versions(self.run_id, self.member, with_unnamed=self.first)
            self._rows.update({v.number: v.id for v in rows})
            if number not in self._rows:
                self._rows[number] = self.archive.add_policy_version(
                    run_id=self.run_id, base_model=self.policy.name, number=number, member=self.member
                )
        return self._rows[number]

    @property
    def number(self) -> int:
        """The version number now serving."""
        return self.policy.version

    def row_of(self, number: int, default: int) -> int:
        """The row of a version seen before (a completion written by it), else `default`."""
        return self._rows.get(number, default)


@dataclass
class PolicyMember:
    """One member of the run's ensemble as the loop drives it: its name and settings' source, its policy (shared
    with members of the same spec when nothing trains), its calls, its version lineage and its training step."""

    name: str
    weight: float
    base: Ask  # what it asks under the `base` arm: its own settings over the run's options
    policy: Policy
    calls: PolicyCalls
    versions: PolicyVersions
    train_step: TrainStep | None = None
    untrainable: str | None = None  # why training skips it (said once, at the start)
