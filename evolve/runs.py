"""A run's identity across sessions: its options, and finding the run that `evolve run` resumes.

Every option is stored with the run when it starts. A resume takes the stored options; an option given
explicitly on resume overrides its stored value, and each override is recorded with the run (shown by
`evolve inspect`), so that leaving out `--max-evaluations 1000` on resume never silently shrinks the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any

from evolve.archive import Archive, ArchiveError, RunRecord
from evolve.options import DEFAULT_POLICY, TRAIN_METHODS, RunOptions, RunOverrides, option_default
from evolve.problem import Problem

__all__ = [  # the options model lives in evolve.options; a run's identity uses it
    "DEFAULT_POLICY",
    "TRAIN_METHODS",
    "RunMismatch",
    "RunOptions",
    "RunOverrides",
    "check_resumable",
    "open_run",
    "option_default",
    "resolve_options",
    "stored_options",
]


class RunMismatch(Exception):
    pass


def check_resumable(archive: Archive, problem: Problem, run_id: int | None = None) -> RunRecord | None:
    """The run of this problem that `evolve run` would resume (the latest, or `run_id`), refusing one made for
    a changed problem."""
    try:
        run = archive.find_run(run_id, problem.name)
    except ArchiveError as exc:
        raise RunMismatch(str(exc)) from None
    if run is not None and run.problem_fingerprint != problem.fingerprint():
        raise RunMismatch(
            f"{archive.url}: run {run.id} of {problem.name} was made with a different "
            "problem.toml or evaluator; use a new --db to start afresh"
        )
    return run


def stored_options(run: RunRecord) -> RunOptions:
    """The options a run was started with (fields unknown to an older archive take their defaults; an older
    archive's empty policy meant the default one)."""
    known = {f.name for f in fields(RunOptions)}
    raw = {k: v for k, v in run.config.get("options", {}).items() if k in known}
    if not raw.get("policy", DEFAULT_POLICY):
        raw["policy"] = DEFAULT_POLICY
    return RunOptions(**raw)


@dataclass(frozen=True)
class ResolvedOptions:
    """The options a session runs with, and the given values that changed a stored run's (name → [stored, given])."""

    options: RunOptions
    changes: dict[str, list[Any]]


@dataclass(frozen=True)
class OpenedRun:
    """The run a session goes on with, and whether it was resumed (False: made now)."""

    run: RunRecord
    resumed: bool


def resolve_options(problem: Problem, run: RunRecord | None, overrides: RunOverrides) -> ResolvedOptions:
    """A new run: what was given over the problem's `[search]`. A resume: the stored options, with each given
    value that differs as an override."""
    chosen = overrides.given()
    if run is None:
        new = RunOptions.for_problem(problem.config.search, problem.config.training, root=problem.root, **chosen)
        return ResolvedOptions(new, {})
    stored = stored_options(run)
    changes = {k: [getattr(stored, k), v] for k, v in chosen.items() if getattr(stored, k) != v}
    return ResolvedOptions(replace(stored, **{k: new for k, (_old, new) in changes.items()}), changes)


def open_run(
    archive: Archive,
    problem: Problem,
    options: RunOptions,
    *,
    run: RunRecord | None = None,
    overrides: Mapping[str, list[Any]] | None = None,
) -> OpenedRun:
    """Resume `run` (default: the latest run of this problem) or start a new one.

    A resumed run found `running` was killed (SIGKILL, power loss): it is counted as an interruption."""
    run = run if run is not None else check_resumable(archive, problem)
    if run is not None:
        config = {**run.config, "options": asdict(options)}
        if overrides:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            config["overrides"] = [*run.config.get("overrides", []), {"at": stamp, "changes": dict(overrides)}]
        state = run.state
        if run.status == "running":
            state = state.updated(interruptions=state.interruptions + 1)
        archive.update_run(run.id, status="running", config=config, state=state)
        return OpenedRun(replace(run, status="running", config=config, state=state), True)
    config = {
        "problem": problem.config.model_dump(mode="json"),
        "problem_path": str(problem.root),
        "problem_hash": problem.fingerprint(),
        "options": asdict(options),
    }
    return OpenedRun(
        archive.create_run(problem.name, str(problem.root), problem.fingerprint(), config, options.seed), False
    )
