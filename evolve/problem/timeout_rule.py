"""The per-evaluation timeout of a run: the command line's `--timeout`, else the problem's own, else one that
follows from the seed's own evaluation time.

Why a rule: a problem that sets no timeout got a fixed one (OpenEvolve's 300 s, or problem.toml's 10 s default),
unrelated to how long its programs take. On a small machine a child that loops then holds a core for five
minutes while sampling starves; with a seed that takes 0.4 s, no sensible child needs 300 s. Where the problem
sets none, the seed is evaluated under the ceiling (so a slow seed still scores), and the children get

    timeout = min(CEILING_S, max(FLOOR_S, FACTOR x the seed's seconds, rounded up to a whole second))

- FACTOR 10: a child may do several times the seed's work, or the same work less cleverly, and still be scored;
  one ten times slower than the program it improves on is rarely the better program.
- FLOOR_S 10 s: a fast seed's tenfold (a few tenths of a second) is within what a busy two-core machine adds to
  any process's start and scheduling; 10 s is also what problem.toml's `[limits] timeout_s` defaults to.
- CEILING_S 300 s: OpenEvolve's own default; the rule never gives a child longer than the format would.

The result is stored with the run (`STORED_KEY` in its config), so a resume keeps the same timeout rather than
deriving it again from a seed evaluated on a machine that is busier or idler this time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from evolve.problem.loader import Problem
    from evolve.problem.outcome import EvalOutcome

FLOOR_S = 10.0
FACTOR = 10.0
CEILING_S = 300.0
STORED_KEY = "timeout"  # in the run's config: the rule's result, {"timeout_s": ..., "seed_s": ...}
OVERRIDE = "--timeout overrides"

Source = Literal["command line", "problem", "seed"]


class StoredRun(Protocol):
    """The run record's part this module reads (the archive is a layer above the problem model)."""

    id: int
    config: Mapping[str, Any]


class RunStore(Protocol):
    """The archive's part this module uses: the run's stored evaluations, and writing its config."""

    def evaluation_rows(self, run: Any) -> list[tuple[Any, Any]]: ...

    def update_run(self, run_id: int, *, config: dict[str, Any] | None = None) -> None: ...


@dataclass(frozen=True)
class TimeoutChoice:
    """The seconds one evaluation may take, and where they come from (for the run's opening line)."""

    timeout_s: float
    source: Source
    seed_s: float | None = None  # the seed's evaluation seconds the rule read (source "seed")

    def line(self) -> str:
        """One opening line: the timeout and why, e.g. `timeout 10 s: 10 x the seed's 0.4 s, at least 10 s (...)`."""
        head = f"timeout {self.timeout_s:g} s"
        if self.source == "command line":
            return f"{head}: --timeout"
        if self.source == "problem":
            return f"{head}: the problem's [limits] timeout_s ({OVERRIDE})"
        seed = f"{FACTOR:g} x the seed's {self.seed_s:.2g} s"
        bound = f"at least {FLOOR_S:g} s" if self.timeout_s == FLOOR_S else f"at most {CEILING_S:g} s"
        bounded = f", {bound}" if self.timeout_s in (FLOOR_S, CEILING_S) else ""
        return f"{head}: {seed}{bounded} (the problem sets none; {OVERRIDE})"

    def as_json(self) -> dict[str, Any]:
        return {"timeout_s": self.timeout_s, "seed_s": self.seed_s}


def derived(seed_s: float) -> TimeoutChoice:
    """The rule's timeout for a seed that evaluated in `seed_s` seconds."""
    return TimeoutChoice(min(CEILING_S, max(FLOOR_S, float(math.ceil(FACTOR * seed_s)))), "seed", seed_s)


def stored_choice(run_config: Mapping[str, Any]) -> TimeoutChoice | None:
    """The rule's result a run stored, or None (a new run, one started before the rule, or an unreadable value)."""
    raw = run_config.get(STORED_KEY)
    if not isinstance(raw, Mapping):
        return None
    timeout, seed = raw.get("timeout_s"), raw.get("seed_s")
    if not isinstance(timeout, int | float) or not 0 < timeout <= CEILING_S:
        return None
    return TimeoutChoice(float(timeout), "seed", float(seed) if isinstance(seed, int | float) else None)


def problem_timeout(problem: Problem) -> float | None:
    """The problem's own timeout, or None where it sets none: problem.toml without `[limits] timeout_s`, or an
    OpenEvolve folder whose config.yaml has no `evaluator.timeout` (its 300 s is the format's default, not the
    author's choice)."""
    from evolve.problem.openevolve import CONFIG, is_openevolve_folder
    from evolve.problem.openevolve_config import read_config

    limits = problem.config.limits
    if is_openevolve_folder(problem.root):
        config = problem.root / CONFIG
        return limits.timeout_s if config.is_file() and read_config(config).stage_timeout_s is not None else None
    return limits.timeout_s if "timeout_s" in limits.model_fields_set else None


def opening_choice(problem: Problem, given_s: float | None, run_config: Mapping[str, Any]) -> TimeoutChoice | None:
    """The timeout known before the seed is scored: `--timeout`, the problem's, or the one the run stored; None
    when it waits for the seed's time (the rule)."""
    if given_s is not None:
        return TimeoutChoice(float(given_s), "command line")
    own = problem_timeout(problem)
    if own is not None:
        return TimeoutChoice(own, "problem")
    return stored_choice(run_config)


def apply(problem: Problem, timeout_s: float) -> None:
    """Every later evaluation of `problem` runs under `timeout_s` (the sandboxes read the problem's limits per
    evaluation). The folder's hashes are taken first: an OpenEvolve folder's inferred settings are part of them,
    and a resume compares them with the folder as it loads, before any timeout is applied."""
    _ = problem.file_hashes
    limits = problem.config.limits.model_copy(update={"timeout_s": timeout_s})
    problem.config = problem.config.model_copy(update={"limits": limits})


def _stored_seed_s(archive: RunStore, run: StoredRun) -> float | None:
    """The seconds of the run's stored seed evaluation (a run started before this rule), or None."""
    seeds = [e.duration_s for p, e in archive.evaluation_rows(run) if p.parent_id is None]
    return seeds[0] if seeds else None


class RunTimeout:
    """The run's timeout from its opening lines to its seed. Made when the run opens: it applies what is known
    then (`--timeout`, the problem's, or the rule's result the run stored; a run started before the rule takes
    the rule on its stored seed); otherwise the seed runs under the ceiling and `seed_scored` applies the rule to
    it and stores the result with the run. `announce` receives the line of a timeout settled after the opening
    lines were printed."""

    def __init__(self, problem: Problem, given_s: float | None, archive: RunStore, run: StoredRun) -> None:
        self.problem, self.archive, self.run_id, self.run_config = problem, archive, run.id, dict(run.config)
        self.announce: Callable[[str], None] = lambda line: None
        self.choice = opening_choice(problem, given_s, run.config)
        if self.choice is None and (seed_s := _stored_seed_s(archive, run)) is not None:
            self._settle(seed_s)
        apply(problem, self.choice.timeout_s if self.choice is not None else CEILING_S)

    def opening_line(self) -> str:
        if self.choice is not None:
            return self.choice.line()
        return (
            f"timeout: set from the seed's time once it is scored ({FACTOR:g} x, at least {FLOOR_S:g} s, at most "
            f"{CEILING_S:g} s; the problem sets none; {OVERRIDE})"
        )

    def seed_scored(self, outcome: EvalOutcome) -> None:
        """Apply the rule to the seed's evaluation seconds (its build's excluded), store it, and announce it; nothing
        when the timeout was settled before."""
        if self.choice is None:
            self._settle(outcome.duration_s - (outcome.build_s or 0.0))
            self.announce(self.choice.line() if self.choice is not None else "")

    def _settle(self, seed_s: float) -> None:
        self.choice = derived(max(seed_s, 0.0))
        apply(self.problem, self.choice.timeout_s)
        self.run_config = {**self.run_config, STORED_KEY: self.choice.as_json()}
        self.archive.update_run(self.run_id, config=self.run_config)
