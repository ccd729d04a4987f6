"""What the loop asks of the policy, and how that changes when groups stop yielding new children.

A small model on an unfamiliar problem mostly echoes its parent, repeats itself or writes something the parser
cannot use. Every `every` groups of a barren streak (counted by `evolve.stopping.Stall`, which also ends the run
when the streak grows too long) the adapter changes one thing about the ask, chosen from the dominant failure:
unparseable answers → whole rewrites first (if it was asking for diffs), copies → a hotter sampler and the other
prompt template first. Each change is a record kept in the run's state (`Run.state["adaptations"]`), together
with the ask arrived at, so a resumed run goes on asking what it last asked.

The number of variants per completion is never changed: the VPO trainer needs m answers per completion.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from evolve.stopping import Stall

TEMPERATURE_STEP = 0.2
MAX_TEMPERATURE = 1.3


@dataclass(frozen=True)
class Ask:
    """The knobs of one group's request; stored with each completion's sampling settings."""

    edit_format: str  # auto | diff | full
    temperature: float
    template: str  # standard | directed (evolve.prompts.TEMPLATES)

    def describe(self) -> str:
        return f"{self.edit_format} edits, temperature {self.temperature:.2g}, {self.template} prompt"


class Adapter:
    def __init__(self, ask: Ask, every: int = 2, changes: list[dict[str, Any]] | None = None) -> None:
        self.base = ask  # what the run's options ask for; the changes start from it
        self.ask = ask
        self.every = every
        self.changes: list[dict[str, Any]] = list(changes or [])

    @classmethod
    def restore(cls, initial: Ask, state: Mapping[str, Any], every: int) -> Adapter:
        """Resume with the ask a previous session arrived at (kept in the run's state). When the options it grew
        from were changed on this resume (say `--temperature 1.0`), the given options win."""
        adapter = cls(initial, every, state.get("adaptations", []))
        saved, base = state.get("ask"), state.get("ask_base")
        if isinstance(saved, dict) and (not isinstance(base, dict) or Ask(**base) == initial):
            adapter.ask = Ask(**saved)
        return adapter

    def state(self) -> dict[str, Any]:
        return {"ask": asdict(self.ask), "ask_base": asdict(self.base), "adaptations": list(self.changes)}

    def tried(self) -> str:
        return "; ".join(c["change"] for c in self.changes)

    def after_barren(self, group: int, stall: Stall) -> dict[str, Any] | None:
        """Called when `group` lengthened the barren streak; every `every`-th such group changes one thing.
        Returns the change (also appended to `changes`), if any."""
        if self.every <= 0 or stall.stalled or stall.barren % self.every:  # every 0: the ask never changes
            return None
        change = self._next(self.ask, stall.copying)
        if change is None:
            return None
        new_ask, what = change
        record = {"group": group, "change": what, "from": asdict(self.ask), "to": asdict(new_ask), "why": stall.why()}
        self.ask = new_ask
        self.changes.append(record)
        return record

    def _next(self, ask: Ask, copying: bool) -> tuple[Ask, str] | None:
        rewrite = []
        if ask.edit_format != "full":
            rewrite.append((replace(ask, edit_format="full"), f"edit format {ask.edit_format} -> full"))
        hotter = min(round(ask.temperature + TEMPERATURE_STEP, 2), MAX_TEMPERATURE)
        heat = (replace(ask, temperature=hotter), f"temperature {ask.temperature:.2g} -> {hotter:.2g}")
        other = "directed" if ask.template == "standard" else "standard"
        template = (replace(ask, template=other), f"prompt template {ask.template} -> {other}")
        # Copies call for more randomness and a sharper ask; unparseable text for an easier format first.
        steps = [heat, template, *rewrite] if copying else [*rewrite, template, heat]
        # Each kind of change is tried once before any is repeated; within a round, the order above decides.
        tried = Counter(_kind(c["change"]) for c in self.changes)
        steps = [s for s in steps if s[0] != ask]
        steps.sort(key=lambda s: tried[_kind(s[1])])
        return steps[0] if steps else None


def _kind(change: str) -> str:
    """`temperature 0.8 -> 1` → `temperature`: what kind of knob a change turned."""
    return change.rsplit(" ", 3)[0]
