"""Yield: how many new, valid children the policy's completions turn into, and where the rest went.

A small model mostly fails by echoing its parent, repeating a known program or writing something unparseable;
these shares tell a user (and, through `evolve.stopping.Stall`, the adapter in `evolve.ask_arms`) which of those is
happening. The same figures come live from the loop's counters and afterwards from the archive's summary
(`Archive.summarize`), so both views agree. A plain value: it imports nothing of the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Variant statuses that produced no program at all.
UNPARSEABLE = ("parse_error", "apply_error", "outside_block", "bad_blocks", "syntax_error")
COPIES = ("unchanged", "duplicate")  # the parent echoed, or a program already known


@dataclass
class Yield:
    completions: int = 0
    tokens: int = 0
    new_valid: int = 0  # variants that became a new program which evaluated without error
    statuses: Mapping[str, int] = field(default_factory=dict)
    cut: int = 0  # completions that stopped at their token budget: their last variant is usually half-written

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

    @property
    def cut_share(self) -> float:
        """Of completions, not variants: a cut completion is one budget decision (`max_new_tokens`) to revisit."""
        return self.cut / self.completions if self.completions else 0.0

    def variant_shares(self) -> str:
        return (
            f"unchanged {self.unchanged:.0%}, duplicate {self.duplicate:.0%}, unparseable {self.unparseable:.0%}; "
            f"completions cut at the token budget {self.cut_share:.0%}"
        )

    def shares(self) -> str:
        return f"{self.unchanged:.0%} unchanged, {self.duplicate:.0%} duplicate, {self.unparseable:.0%} unparseable"

    def line(self) -> str:
        return (
            f"{self.per_completion:.2f} new valid children per completion, {self.per_1k_tokens:.2f} per 1k tokens; "
            f"variants {self.variant_shares()}"
        )

    def as_dict(self) -> dict[str, float | int]:
        return {
            "completions": self.completions,
            "tokens": self.tokens,
            "new_valid": self.new_valid,
            "per_completion": self.per_completion,
            "per_1k_tokens": self.per_1k_tokens,
            "unchanged": self.unchanged,
            "duplicate": self.duplicate,
            "unparseable": self.unparseable,
            "cut": self.cut,
            "cut_share": self.cut_share,
        }
