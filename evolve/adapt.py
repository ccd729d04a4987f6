"""What the loop asks of the policy, and how that changes when groups stop yielding new children.

A small model on an unfamiliar problem mostly echoes its parent, repeats itself or writes something the parser
cannot use. After `every` consecutive groups without a new child the adapter changes one thing about the ask,
chosen from the dominant failure: unparseable variants → whole rewrites (if it was asking for diffs), copies and
duplicates → a hotter sampler and the `directed` template that gives each variant its own kind of change.
Each change is returned as a record for the run's state in the archive; after `stall` barren groups in a row
the run stops with one line saying what was tried and what to change.

The number of variants per completion is never changed: the VPO trainer needs m answers per completion.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from evolve.yields import UNPARSEABLE

TEMPERATURE_STEP = 0.2
MAX_TEMPERATURE = 1.3
RECENT_PER_PARENT = 2


@dataclass(frozen=True)
class Ask:
    """The knobs of one group's request; stored with each completion's sampling settings."""

    edit_format: str  # diff | full | auto
    temperature: float
    template: str  # standard | directed

    def describe(self) -> str:
        return f"{self.edit_format} edits, temperature {self.temperature:.2g}, {self.template} prompt"


@dataclass
class Adapter:
    ask: Ask
    every: int = 2  # barren groups before the next change
    stall: int = 6  # barren groups in a row that end the run
    barren: int = 0
    window: Counter[str] | None = None  # variant statuses over the current barren streak
    changes: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        self.window = Counter()
        self.changes = [] if self.changes is None else self.changes

    @classmethod
    def restore(cls, initial: Ask, state: Mapping[str, Any], every: int, stall: int) -> Adapter:
        """Resume with the ask a previous session had arrived at (kept in the run's state)."""
        saved = state.get("ask")
        ask = Ask(**saved) if isinstance(saved, dict) else initial
        return cls(ask, every, stall, changes=list(state.get("adaptations", [])))

    def state(self) -> dict[str, Any]:
        return {"ask": asdict(self.ask), "adaptations": list(self.changes or [])}

    def after_group(self, group: int, new_children: int, statuses: Mapping[str, int]) -> dict[str, Any] | None:
        """Count one finished group; returns the change made (also appended to `changes`), if any."""
        assert self.window is not None and self.changes is not None
        if new_children:
            self.barren = 0
            self.window.clear()
            return None
        self.barren += 1
        self.window.update(statuses)
        if self.barren >= self.stall or self.barren % self.every:
            return None
        change = self._next(self.ask)
        if change is None:
            return None
        new_ask, what = change
        record = {"group": group, "change": what, "from": asdict(self.ask), "to": asdict(new_ask), "why": self.why()}
        self.ask = new_ask
        self.changes.append(record)
        return record

    @property
    def stalled(self) -> bool:
        return self.barren >= self.stall

    def why(self) -> str:
        assert self.window is not None
        total = sum(self.window.values()) or 1
        unparseable = sum(self.window[s] for s in UNPARSEABLE)
        return (
            f"{self.barren} groups without a new child: {self.window['unchanged'] / total:.0%} unchanged, "
            f"{self.window['duplicate'] / total:.0%} duplicate, {unparseable / total:.0%} unparseable"
        )

    def _next(self, ask: Ask) -> tuple[Ask, str] | None:
        assert self.window is not None
        copies = self.window["unchanged"] + self.window["duplicate"]
        unparseable = sum(self.window[s] for s in UNPARSEABLE)
        steps = []
        if ask.edit_format != "full":
            steps.append((replace(ask, edit_format="full"), f"edit format {ask.edit_format} -> full"))
        hotter = min(round(ask.temperature + TEMPERATURE_STEP, 2), MAX_TEMPERATURE)
        heat = (replace(ask, temperature=hotter), f"temperature {ask.temperature:.2g} -> {hotter:.2g}")
        other = "directed" if ask.template == "standard" else "standard"
        template = (replace(ask, template=other), f"prompt template {ask.template} -> {other}")
        # Copies call for more randomness and a sharper ask; unparseable text for an easier format first.
        steps = [heat, template, *steps] if copies >= unparseable else [*steps, template, heat]
        # Each kind of change is tried once before any is repeated; within a round, the order above decides.
        tried = Counter(c["change"].rsplit(" ", 3)[0] for c in self.changes or [])
        steps = [s for s in steps if s[0] != ask]
        steps.sort(key=lambda s: tried[s[1].rsplit(" ", 3)[0]])
        return steps[0] if steps else None

    def stall_message(self) -> str:
        tried = "; ".join(c["change"] for c in self.changes or []) or "nothing else to try"
        assert self.window is not None
        copies = self.window["unchanged"] + self.window["duplicate"]
        if copies >= sum(self.window[s] for s in UNPARSEABLE):
            fix = "the model keeps copying: name in the description what to change, or use a larger --policy"
        else:
            fix = "the model's answers do not parse: use a larger --policy or a shorter editable block"
        return f"stalled: {self.why()} (tried: {tried}; now {self.ask.describe()}); {fix}"


class RecentChildren:
    """The last few variants written from each parent, to show in its next prompts (in memory, bounded)."""

    def __init__(self, per_parent: int = RECENT_PER_PARENT, parents: int = 256) -> None:
        self.per_parent, self.parents = per_parent, parents
        self._by_parent: dict[int, deque[str]] = {}

    def add(self, parent_id: int, code: str) -> None:
        seen = self._by_parent.pop(parent_id, None) or deque(maxlen=self.per_parent)
        if code not in seen:
            seen.append(code)
        self._by_parent[parent_id] = seen  # most recently used last
        if len(self._by_parent) > self.parents:
            self._by_parent.pop(next(iter(self._by_parent)))

    def of(self, parent_id: int) -> list[str]:
        return list(self._by_parent.get(parent_id, ()))
