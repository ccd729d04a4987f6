"""Yield: how many new, valid children the policy's completions turn into, and where the rest went.

A small model mostly fails by echoing its parent, repeating a sibling or writing something unparseable; these
shares tell a user (and the adapter in `evolve.adapt`) which of those is happening. The same figures are drawn
live from the loop's counters and afterwards from the archive, so both views agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlalchemy import func, select

from evolve.archive.models import Completion, Evaluation, Prompt, Variant
from evolve.archive.store import Archive

# Variant statuses that produced no program at all.
UNPARSEABLE = ("parse_error", "apply_error", "outside_block", "syntax_error")


@dataclass
class Yield:
    completions: int = 0
    tokens: int = 0
    new_valid: int = 0  # variants that became a new program which evaluated without error
    statuses: Mapping[str, int] = field(default_factory=dict)

    @property
    def variants(self) -> int:
        return sum(self.statuses.values())

    @property
    def per_completion(self) -> float:
        return self.new_valid / self.completions if self.completions else 0.0

    @property
    def per_1k_tokens(self) -> float:
        return 1000.0 * self.new_valid / self.tokens if self.tokens else 0.0

    def share(self, *statuses: str) -> float:
        total = self.variants
        return sum(self.statuses.get(s, 0) for s in statuses) / total if total else 0.0

    @property
    def unchanged(self) -> float:
        return self.share("unchanged")

    @property
    def duplicate(self) -> float:
        return self.share("duplicate")

    @property
    def unparseable(self) -> float:
        return self.share(*UNPARSEABLE)

    def line(self) -> str:
        return (
            f"{self.per_completion:.2f} new valid children per completion, {self.per_1k_tokens:.2f} per 1k tokens; "
            f"variants unchanged {self.unchanged:.0%}, duplicate {self.duplicate:.0%}, "
            f"unparseable {self.unparseable:.0%}"
        )


def run_yield(archive: Archive, run_id: int) -> Yield:
    """The run's yield from the archive (one scan; for `inspect` and benchmarks, never per iteration)."""
    with archive.session() as s:
        completions, token_bytes = s.execute(
            select(func.count(Completion.id), func.coalesce(func.sum(func.length(Completion.token_ids)), 0))
            .join(Prompt)
            .where(Prompt.run_id == run_id)
        ).one()
        statuses = dict(
            s.execute(
                select(Variant.status, func.count())
                .join(Completion)
                .join(Prompt)
                .where(Prompt.run_id == run_id)
                .group_by(Variant.status)
            ).all()
        )
        new_valid = s.scalar(
            select(func.count(Variant.id))
            .join(Completion)
            .join(Prompt)
            .join(Evaluation, Evaluation.program_id == Variant.program_id)
            .where(Prompt.run_id == run_id, Variant.status == "ok", Evaluation.error_kind.is_(None))
        )
    return Yield(int(completions), int(token_bytes) // 4, int(new_valid or 0), statuses)
