"""The ask: what a group requests of its policy, and the ask arms that the ensemble's bandit chooses among.

A small model on an unfamiliar problem mostly echoes its parent, repeats itself or writes something the parser
cannot use; asking differently (whole rewrites instead of diffs, a hotter sampler, a prompt that gives each
variant its own kind of change) sometimes unblocks it. Each such way of asking is an arm: `base` asks what the
member's settings say, `hotter` raises its temperature by 0.2 (at most 1.3), `template` swaps the prompt
template, `full` asks for whole rewrites. Which arm a group uses is the bandit's choice (evolve.ensemble), from
the new children each arm's groups brought per token; the stall rule (evolve.stopping.Stall) still ends a run
whose groups stop producing. Arms apply to every member, each from its own settings, so an arm's record pools
what it did for all of them.

The number of variants per completion is never changed: the VPO trainer needs m answers per completion.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from evolve.problem.config import SearchSection

TEMPERATURE_STEP = 0.2
MAX_TEMPERATURE = 1.3
ASK_ARMS = ("base", "hotter", "template", "full")


class AskError(ValueError):
    """An `asks` option names an unknown arm."""


@dataclass(frozen=True)
class Ask:
    """The knobs of one group's request; stored with each completion's sampling settings."""

    edit_format: str  # auto | diff | full
    temperature: float
    template: str  # standard | directed (evolve.prompts.TEMPLATES)
    top_p: float = SearchSection.model_fields["top_p"].default  # [search]'s

    def describe(self) -> str:
        return f"{self.edit_format} edits, temperature {self.temperature:.2g}, {self.template} prompt"


def ask_arms(text: str) -> list[str]:
    """The arms named by an `asks` option (`base,hotter,template,full`); `base` is always among them, first."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ASK_ARMS]
    if unknown:
        raise AskError(f"asks {text!r}: unknown arm(s) {', '.join(unknown)}; use some of {', '.join(ASK_ARMS)}")
    return ["base", *dict.fromkeys(n for n in names if n != "base")]


def apply_arm(arm: str, base: Ask) -> Ask:
    """The ask that `arm` makes of a member whose own settings ask `base` (the same ask when it changes nothing)."""
    if arm == "hotter":
        return replace(base, temperature=min(round(base.temperature + TEMPERATURE_STEP, 2), MAX_TEMPERATURE))
    if arm == "template":
        return replace(base, template="directed" if base.template == "standard" else "standard")
    if arm == "full":
        return replace(base, edit_format="full")
    return base
