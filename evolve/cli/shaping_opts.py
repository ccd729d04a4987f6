"""The reward-shaping flags `evolve run` and `evolve train` share (policies/shaping.py says what each does)."""

from __future__ import annotations

from typing import Annotated

import typer

from evolve.cli.common import default_note, fail, one_of
from policies.shaping import NORMALISATIONS

THE_PROBLEMS = default_note("the problem's [training], else on / 0 / bounds")

SkipZeroOpt = Annotated[
    bool | None,
    typer.Option(
        "--skip-zero-advantage/--keep-zero-advantage",
        help=f"leave zero-advantage groups and completions out of an update's batch {THE_PROBLEMS}",
    ),
]
LazyPenaltyOpt = Annotated[
    float | None,
    typer.Option(help=f"reward (<= 0) of an answer that echoes its parent or repeats a program; 0: off {THE_PROBLEMS}"),
]
NormalisationOpt = Annotated[
    str | None,
    typer.Option(
        help=f"{' | '.join(NORMALISATIONS)}: rewards by the declared bounds, or each component stretched to [0, 1] "
        f"over its group {THE_PROBLEMS}"
    ),
]


def check_shaping(lazy_penalty: float | None, reward_normalisation: str | None) -> None:
    """One line and exit 2 for a shaping flag that cannot work, before any model loads."""
    if lazy_penalty is not None and not lazy_penalty <= 0:
        fail(f"--lazy-penalty {lazy_penalty}: give a value <= 0 (below a valid answer's reward), or 0 for off")
    if reward_normalisation not in (None, *NORMALISATIONS):
        fail(f"--reward-normalisation {reward_normalisation}: use {one_of(NORMALISATIONS)}")
