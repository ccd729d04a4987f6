"""The ensemble's record: which member and which ask each group goes to, and what each has brought.

Two allocators (evolve.bandit) share the groups: one among the members (the policies of the run), one among the
ask arms (evolve.ask_arms), both from the same outcomes. A group's cost (its tokens, or its seconds) is charged to
its member and its ask when it is sampled; its value arrives as its children are scored: one per new valid child,
one more per child that beats its parent's scalar, one more per new best of the run. Copies (unchanged variants
and duplicates) bring nothing while their tokens cost, so they count against the member and ask that wrote them.

The record is kept in the run's state (`RunState.ensemble`, saved every few seconds and at the end) and read
back on resume by name: a member that is no longer listed keeps its record there (and gets it back if listed
again), a new one starts from its prior, and an order that changed changes nothing. What changed is said in
one line (`changes`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from evolve.bandit import COST_UNIT, Allocator, ArmView
from evolve.members import MemberSpec
from evolve.yields import COPIES

RECENT = 20  # groups over which the current allocation share is counted
CHARS_PER_TOKEN = 4  # what a completion without token ids (a replay, some servers) is charged per character


class EnsembleError(ValueError):
    """A bad allocation, cost or ask option."""


@dataclass
class Tally:
    """One arm's record: what the allocator reads (groups, cost, value) and what the views show."""

    groups: int = 0
    completions: int = 0
    tokens: int = 0
    seconds: float = 0.0
    cost: float = 0.0
    value: float = 0.0
    valid: int = 0  # new children evaluated without error
    improved: int = 0  # of them, those that beat their parent's scalar
    bests: int = 0  # of them, those that were the run's new best when they landed
    copies: int = 0  # variants unchanged from their parent or duplicating an archived program
    best_scalar: float | None = None
    best_id: int | None = None

    @classmethod
    def of(cls, raw: Any) -> Tally:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in known}) if isinstance(raw, Mapping) else cls()

    def view(self, prior: float) -> ArmView:
        return ArmView(prior, self.groups, self.cost, self.value)


@dataclass(frozen=True)
class Choice:
    """Who samples a group and how it asks."""

    member: int  # index into the ensemble's members
    ask: str  # ask arm name


class Ensemble:
    def __init__(
        self,
        members: Sequence[MemberSpec],
        asks: Sequence[str],
        *,
        allocation: str = "bandit",
        cost: str = "tokens",
        seed: int = 0,
        state: Mapping[str, Any] | None = None,
    ) -> None:
        if cost not in COST_UNIT:
            raise EnsembleError(f"bandit cost {cost!r}: use one of {', '.join(COST_UNIT)}")
        self.members, self.asks, self.cost_kind, self.seed = list(members), list(asks), cost, seed
        self.by_member = Allocator(allocation)
        self.by_ask = Allocator("bandit" if allocation == "bandit" else "uniform")
        saved = state.get("ensemble", {}) if state else {}
        saved = saved if isinstance(saved, Mapping) else {}
        stored: dict[str, Any] = dict(saved.get("members", {}))
        self.tallies = {m.name: Tally.of(stored.pop(m.name, None)) for m in self.members}
        self.retired = stored  # records of members no longer listed, kept for the archive's sake
        asked: dict[str, Any] = dict(saved.get("asks", {}))
        self.ask_tallies = {a: Tally.of(asked.pop(a, None)) for a in self.asks}
        self.retired_asks = asked
        self.recent: deque[str] = deque(saved.get("recent", []), maxlen=RECENT)
        # Groups chosen and not yet stored: they count as given, so that groups sampled in parallel spread out
        self.in_flight: Counter[tuple[str, str]] = Counter()  # ("member" | "ask", name) → groups
        self.changes = _changes(list(saved.get("order", [])), [m.name for m in self.members]) if saved else None

    # ---- choosing ---------------------------------------------------------------------------------------
    def choose(self, index: int) -> Choice:
        """The member and ask for group `index`: deterministic in (seed, index) and the outcomes so far."""
        member = self.by_member.choose(
            [self._view(("member", m.name), self.tallies[m.name], m.weight) for m in self.members],
            np.random.default_rng([self.seed, index, 24]),
        )
        ask = self.by_ask.choose(
            [self._view(("ask", a), self.ask_tallies[a], 1.0) for a in self.asks],
            np.random.default_rng([self.seed, index, 25]),
        )
        choice = Choice(member, self.asks[ask])
        self.in_flight.update([("member", self.members[member].name), ("ask", choice.ask)])
        return choice

    def _view(self, key: tuple[str, str], tally: Tally, prior: float) -> ArmView:
        return ArmView(prior, tally.groups + self.in_flight[key], tally.cost, tally.value)

    def settled(self, member: str, ask: str) -> None:
        """A chosen group was stored, cut short or lost: it is no longer in flight."""
        self.in_flight.subtract([("member", member), ("ask", ask)])

    # ---- what groups cost and brought -------------------------------------------------------------------
    def sampled(
        self, member: str, ask: str, completions: int, tokens: int, seconds: float, statuses: Mapping[str, int]
    ) -> None:
        """Charge a stored group to its member and ask (`tokens`: counted, or estimated from the text)."""
        spent = (tokens if self.cost_kind == "tokens" else seconds) / COST_UNIT[self.cost_kind]
        copies = sum(statuses.get(s, 0) for s in COPIES)
        for tally in self._tallies(member, ask):
            tally.groups += 1
            tally.tokens += tokens
            tally.seconds += seconds
            tally.cost += spent
            tally.copies += copies
            tally.completions += completions
        self.recent.append(member)

    def credit(self, member: str, ask: str, *, improved: bool, new_best: bool, scalar: float, program_id: int) -> None:
        """A child of the member's group landed, evaluated without error."""
        for tally in self._tallies(member, ask):
            tally.valid += 1
            tally.improved += improved
            tally.bests += new_best
            tally.value += 1 + improved + new_best
            if tally.best_scalar is None or scalar > tally.best_scalar:
                tally.best_scalar, tally.best_id = scalar, program_id

    def _tallies(self, member: str, ask: str) -> list[Tally]:
        found = [self.tallies.get(member) or self.retired_tally(member), self.ask_tallies.get(ask)]
        return [t for t in found if t is not None]

    def retired_tally(self, member: str) -> Tally | None:
        """A child of a member no longer listed (queued before a resume) still counts in its kept record."""
        if member not in self.retired:
            return None
        tally = Tally.of(self.retired[member])
        self.retired[member] = tally
        return tally

    def tried(self) -> str:
        """The arms tried so far, for the stall line."""
        asks = [a for a in self.asks if self.ask_tallies[a].groups]
        members = [m.name for m in self.members if self.tallies[m.name].groups]
        said = f"asks {', '.join(asks)}" if len(self.asks) > 1 else ""
        if len(self.members) > 1:
            said += ("; " if said else "") + f"members {', '.join(members)}"
        return said

    # ---- state and views --------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        def plain(records: Mapping[str, Any]) -> dict[str, Any]:
            return {k: asdict(v) if isinstance(v, Tally) else v for k, v in records.items()}

        return {
            "ensemble": {
                "order": [m.name for m in self.members],
                "members": plain({**self.retired, **self.tallies}),
                "asks": plain({**self.retired_asks, **self.ask_tallies}),
                "recent": list(self.recent),
            }
        }

    def shares(self) -> dict[str, float]:
        """Each member's share of the last `RECENT` groups: the current allocation."""
        counts = Counter(self.recent)
        return {m.name: counts[m.name] / len(self.recent) if self.recent else 0.0 for m in self.members}

    def rows(self) -> list[dict[str, Any]]:
        """One row per member, then per ask arm: groups, share, tokens, yield, improvements, best child."""
        total = sum(t.groups for t in self.tallies.values()) or 1
        recent = self.shares()
        expected = self.by_member.expected([self.tallies[m.name].view(m.weight) for m in self.members])
        rows = [
            _row("member", m.name, self.tallies[m.name], total, recent[m.name], rate)
            for m, rate in zip(self.members, expected, strict=True)
        ]
        ask_total = sum(t.groups for t in self.ask_tallies.values()) or 1
        rows += [_row("ask", a, self.ask_tallies[a], ask_total, None, None) for a in self.asks]
        return rows

    def lines(self) -> list[str]:
        """The live view's lines, one per member and ask arm."""
        return [
            f"{r['kind']} {r['name']}: {r['groups']} groups ({r['share']:.0%}"
            + (f", now {r['recent_share']:.0%}" if r["recent_share"] is not None else "")
            + f"), {r['valid']} new valid, {r['improved']} improved, {r['copies']} copies, "
            f"{r['valid_per_1k_tokens']:.2f}/1k tokens"
            + (f", best {r['best_scalar']:.4g} (#{r['best_id']})" if r["best_scalar"] is not None else "")
            for r in self.rows()
            if len(self.members) > 1 or r["kind"] == "ask"
        ]


def _row(kind: str, name: str, t: Tally, total: int, recent: float | None, rate: float | None) -> dict[str, Any]:
    return {
        "kind": kind,
        "name": name,
        **asdict(t),
        "share": t.groups / total,
        "recent_share": recent,
        "valid_per_1k_tokens": 1000.0 * t.valid / t.tokens if t.tokens else 0.0,
        "value_per_cost": rate,
    }


def _changes(before: list[str], now: list[str]) -> str | None:
    """The one line a resume says when its members differ from those the run's record was kept for."""
    added = [n for n in now if n not in before]
    removed = [n for n in before if n not in now]
    if not added and not removed:
        return "ensemble: members reordered; each keeps its record (matched by name)" if before != now else None
    parts = []
    if added:
        parts.append(f"{', '.join(added)} added (starting from its prior)")
    if removed:
        parts.append(f"{', '.join(removed)} removed (its groups and record stay in the archive)")
    return f"ensemble: {'; '.join(parts)}; {len(now)} member(s) go on"


def estimated_tokens(texts: Sequence[str], counted: Sequence[int | None]) -> int:
    """A group's tokens: counted where the policy returned token ids, else estimated from the text's length."""
    return sum(n if n is not None else -(-len(t) // CHARS_PER_TOKEN) for t, n in zip(texts, counted, strict=True))
