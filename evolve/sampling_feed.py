"""Publishes the group being sampled to the archive every few seconds, for `evolve serve` (another process).

The policy counts its tokens in memory (`policies.policy.SamplingProgress`, which the run's live view reads);
this thread copies that count into the archive's progress row at most every `every` seconds while a group is
sampled, and clears it when the group ends. One small UPDATE per write: nothing the run waits for.
"""

from __future__ import annotations

import threading

from evolve.archive import StorageError
from evolve.archive.facade import Archive
from evolve.archive.progress import SamplingSnapshot, publish_sampling
from policies.policy import Policy, ProgressReporting

FEED_EVERY_S = 2.0


def feed_sampling(
    policy: Policy, archive: Archive, run_id: int, done: threading.Event, every: float = FEED_EVERY_S
) -> None:
    """Run until `done` is set (on a thread of its own); a policy that counts no progress publishes nothing."""
    if not isinstance(policy, ProgressReporting):
        return
    shown = False
    while not done.wait(every):
        progress = policy.progress
        if progress.active:
            snapshot = SamplingSnapshot(
                progress.rows, progress.rows_done, progress.tokens, progress.prompt_tokens, progress.elapsed_s
            )
            shown = _publish(archive, run_id, snapshot) or shown
        elif shown:
            shown = not _publish(archive, run_id, None)
    if shown:
        _publish(archive, run_id, None)


def _publish(archive: Archive, run_id: int, snapshot: SamplingSnapshot | None) -> bool:
    """True when written; a busy or lost database skips this write (the next one tries again): progress must
    never stop a run."""
    try:
        publish_sampling(archive, run_id, snapshot)
    except StorageError:
        return False
    return True
