"""A run's identity across sessions: its options, and finding the run that `evolve run` resumes.

Every option is stored with the run when it starts. A resume takes the stored options; an option given
explicitly on resume overrides its stored value, and each override is recorded with the run (shown by
`evolve inspect`), so that leaving out `--max-evaluations 1000` on resume never silently shrinks the run.

A run also stores its problem folder's fingerprint, one hash per file (evolve/problem/fingerprint.py), taken when
it starts: a resume compares the folder with it and refuses a folder whose scoring may have changed, naming the
files. Archives from before per-file hashes stored one hash of problem.toml and the evaluator; they are compared
that way and upgraded on the resume that passes, which says so. A folder that moved (same files, another path) is
resumed, and its new path is recorded with the run, so that `evolve resume DB` finds it afterwards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from datetime import UTC, datetime
from typing import Any

from evolve.archive import Archive, ArchiveError, RunRecord
from evolve.options import DEFAULT_POLICY, RunOptions, RunOverrides
from evolve.problem import Problem
from evolve.problem.config import FitnessSection
from evolve.problem.fingerprint import changes, is_file_hashes, legacy_fingerprint

FILES = "problem_files"  # the run config's key of its problem folder's per-file hashes (path -> sha256)
OLD_CHECK = "problem.toml and the evaluator"  # what an archive from before per-file hashes had hashed


class RunMismatch(Exception):
    pass


def check_resumable(archive: Archive, problem: Problem, run_id: int | None = None) -> RunRecord | None:
    """The run of this problem that `evolve run` would resume (the latest, or `run_id`), refusing one made for
    a changed problem."""
    try:
        run = archive.find_run(run_id, problem.name)
    except ArchiveError as exc:
        raise RunMismatch(str(exc)) from None
    unreadable = None if run is None else unreadable_config(archive.url, run)
    if unreadable is not None:
        raise RunMismatch(unreadable)
    said = None if run is None else _changed(run, problem)
    if said is not None:
        raise RunMismatch(f"{archive.url}: {said}")
    return run


def _changed(run: RunRecord, problem: Problem) -> str | None:
    """Why the folder is not the one `run` started with (one line ending in the fix), or None when it is."""
    stored = run.config.get(FILES)
    if stored is None:  # an archive from before per-file hashes: the old comparison, no more and no less
        old = legacy_fingerprint(problem.root, problem.evaluator_path, problem.config.model_dump_json())
        if run.problem_fingerprint == old:
            return None
        return (
            f"run {run.id} of {problem.name} was made with a different problem.toml or evaluator (it was started "
            f"before evolve hashed every file of the folder, so only {OLD_CHECK} are compared); use a new --db to "
            "start afresh"
        )
    if not is_file_hashes(stored):
        return f"run {run.id}'s stored file hashes cannot be read; restore the archive from a copy, or use a new --db"
    diff = changes(stored, problem.file_hashes)
    if not diff:
        return None
    them, were = ("it", "it was") if diff.count == 1 else ("them", "they were")
    return (
        f"{diff.describe()} since run {run.id} of {problem.name} started; use a new --db to start afresh, or put "
        f"{them} back as {were} to resume the run"
    )


def unreadable_config(url: str, run: RunRecord) -> str | None:
    """The one line that says a run's stored config cannot be read (written over by hand or by another tool): not
    a table of tables, its problem's fitness not valid, or an option not of its declared type; None when it can.
    Every command that reads a stored run checks it first, rather than failing in the first read with a traceback."""
    config = run.config if isinstance(run.config, dict) else {}
    problem, options = config.get("problem"), config.get("options", {})
    if not (isinstance(problem, dict) and isinstance(options, dict) and isinstance(problem.get("program", {}), dict)):
        said: str | None = "it is not a table holding the tables problem and options"
    else:
        try:
            FitnessSection.model_validate(problem.get("fitness"))
            said = _option_type_error(options)
        except ValueError as exc:  # pydantic's ValidationError
            said = f"its problem's fitness table: {_first_error(exc)}"
    if said is None:
        return None
    return f"{url}: run {run.id}'s stored config cannot be read ({said}); restore the archive from a copy"


def _first_error(exc: ValueError) -> str:
    """A validation error's first complaint (pydantic lists each with its place), else the error itself."""
    errors = getattr(exc, "errors", None)
    if not callable(errors) or not errors():
        return str(exc)
    first = errors()[0]
    place = ".".join(map(str, first.get("loc", ())))
    return f"{place}: {first.get('msg', '')}" if place else str(first.get("msg", ""))


_TYPES = {"int": int, "float": float, "bool": bool, "str": str}


def _option_type_error(values: Mapping[str, Any]) -> str | None:
    """The first stored option whose value is not of the type `RunOptions` declares; names it does not know (an
    older or newer engine's, which `stored_options` leaves out) are not looked at."""
    for f in fields(RunOptions):
        if f.name not in values:
            continue
        value, declared = values[f.name], str(f.type)
        if value is None and declared.endswith(" | None"):
            continue
        kind = _TYPES.get(declared.removesuffix(" | None"), list)
        fits = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
        fits = fits or (kind is float and isinstance(value, int) and not isinstance(value, bool))  # JSON's 1.0 is 1
        if kind is list:
            fits = fits and all(isinstance(item, dict) for item in value)
        if not fits:
            return f"its option {f.name} is {value!r}, not {declared}"
    return None


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
    """The run a session goes on with, whether it was resumed (False: made now), and what its resume found to say
    (the folder moved; an older archive's problem compared the old way), one line each."""

    run: RunRecord
    resumed: bool
    notes: tuple[str, ...] = ()


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
        return _resume(archive, problem, options, run, overrides or {})
    config = {
        "problem": problem.config.model_dump(mode="json"),
        "problem_path": str(problem.root),
        "problem_hash": problem.fingerprint(),
        FILES: dict(problem.file_hashes),
        "options": asdict(options),
    }
    return OpenedRun(
        archive.create_run(problem.name, str(problem.root), problem.fingerprint(), config, options.seed), False
    )


def _resume(
    archive: Archive, problem: Problem, options: RunOptions, run: RunRecord, overrides: Mapping[str, list[Any]]
) -> OpenedRun:
    """Mark `run` running again with `options`, recording the options given on this resume and what else changed:
    the folder's path when it moved, the per-file hashes when the run was started before them (checked the old way
    by `check_resumable`; from now on every file is compared). Each is an entry of this resume's record, which
    `evolve inspect` shows."""
    config = {**run.config, "options": asdict(options)}
    changed, notes = dict(overrides), []
    where, was = str(problem.root), str(run.config.get("problem_path") or run.problem_dir)
    if where != was:
        config["problem_path"], changed["problem_path"] = where, [was, where]
        notes.append(f"the problem folder moved from {was} to {where}; the run records its new place")
    if FILES not in run.config:
        config[FILES], config["problem_hash"] = dict(problem.file_hashes), problem.fingerprint()
        changed["problem_check"] = [OLD_CHECK, "every file of the folder"]
        notes.append(
            f"run {run.id} was started before evolve hashed every file of the problem folder: only {OLD_CHECK} were "
            "compared on this resume; its files are hashed now, and every later resume compares them all"
        )
    if changed:
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        config["overrides"] = [*run.config.get("overrides", []), {"at": stamp, "changes": changed}]
    state = run.state
    if run.status == "running":
        state = state.updated(interruptions=state.interruptions + 1)
    fingerprint = problem.fingerprint()
    archive.run_store.update(
        run.id, status="running", config=config, state=state, problem_dir=where, fingerprint=fingerprint
    )
    opened = replace(
        run, status="running", config=config, state=state, problem_dir=where, problem_fingerprint=fingerprint
    )
    return OpenedRun(opened, True, tuple(notes))
