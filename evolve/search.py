"""The Python API: `build_search` wires a problem, an archive, a policy and a sandbox into a runnable search.

`evolve run` is this function plus flag checks, a live view and an exit code; a library user calls it directly:

    from evolve.problem import load_problem
    from evolve.runs import RunOptions
    from evolve.search import build_search

    problem = load_problem("problems/circle_packing")
    options = RunOptions.for_problem(problem.config.search, max_evaluations=50, policy="embedded")
    search = build_search(problem, options, db="runs/circle.db", sandbox="process")

A `RunOptions` is taken whole; on resume its fields that differ from the stored ones are recorded as overrides.
A mapping of option names (None = not given) resumes with the stored options and overrides only what it names,
as `evolve run` and `evolve resume` do.
    try:
        print(search.run())          # why it stopped; the archive holds everything it found
    finally:
        search.close()
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from evolve.archive import Archive, ArchiveError, archive_url, sqlite_file
from evolve.loop import SearchLoop, run_search
from evolve.problem import Problem
from evolve.runs import RunMismatch, RunOptions, check_resumable, open_run, resolve_options
from evolve.training import ArchiveTrainer, TrainingUnsupported, restore_latest_adapter
from policies.base import Policy, PolicyError
from policies.factory import make_policy
from policies.trainer import TrainConfig
from sandboxes.base import Sandbox, SandboxRefused
from sandboxes.factory import SandboxUnavailable, make_sandbox, weak_sandbox_refusal

DEFAULT_POLICY = "embedded"  # the embedded model on llama.cpp where it is installed, else transformers


class SearchSetupError(Exception):
    """The search cannot start; `str()` says what to fix. Nothing was written that a retry would not reuse."""


@dataclass
class Search:
    """A wired search, ready to run (or resume). `run()` returns why it stopped."""

    loop: SearchLoop
    db: str | Path
    resumed: bool
    restored_version: int | None  # the trained policy version served again on resume, if any
    adapters_dir: Path | None  # where new adapters go when training is on
    previous_status: str | None = None  # the run's status before this session (running = it was killed)
    overrides: Mapping[str, list[Any]] | None = None  # options changed on this resume: name → [stored, given]

    @property
    def archive(self) -> Archive:
        return self.loop.archive

    @property
    def policy(self) -> Policy:
        return self.loop.policy

    @property
    def sandbox(self) -> Sandbox:
        return self.loop.sandbox

    def run(self) -> str:
        return run_search(self.loop)

    def close(self) -> None:
        self.sandbox.close()


def default_db(problem: Problem) -> Path:
    return Path("runs") / f"{problem.name}.db"


def adapters_next_to(db: str | Path, name: str) -> Path:
    """`runs/NAME.db` (or its sqlite:/// URL) keeps its adapters in `runs/NAME.adapters/`; a server database's
    run keeps them in `runs/NAME.adapters/` under the working directory."""
    try:
        file = sqlite_file(archive_url(db))
    except ValueError:
        file = None
    return file.with_suffix(".adapters") if file is not None else Path("runs") / f"{name}.adapters"


def build_search(
    problem: Problem,
    options: RunOptions | Mapping[str, Any] | None = None,
    *,
    db: str | Path | None = None,
    run_id: int | None = None,
    sandbox: str | None = None,
    learning_rate: float | None = None,
    adapters_dir: Path | None = None,
    trainer_model: str | None = None,
    allow_weak_sandbox: bool = False,
) -> Search:
    """Open (or create) the archive, start or resume the problem's run (the latest, or `run_id`), load the
    policy and the sandbox, and set up training when `train_every` > 0. The policy is a spec such as
    `embedded` or `transformers:DIR` (see `policies.factory`). Raises `SearchSetupError` with a one-line fix."""
    given: dict[str, Any] = dict(asdict(options) if isinstance(options, RunOptions) else (options or {}))
    for name, value in (("sandbox", sandbox), ("learning_rate", learning_rate), ("trainer_model", trainer_model)):
        given[name] = value if value is not None else given.get(name)
    if adapters_dir is not None:
        given["adapters_dir"] = str(adapters_dir)
    if allow_weak_sandbox:
        given["allow_weak_sandbox"] = True
    if given.get("policy") == "":
        given["policy"] = None
    target_db = db if db is not None else default_db(problem)
    try:  # quick checks first; the policy (slow for local models) after them, before any write
        archive = Archive(target_db)
        existing = check_resumable(archive, problem, run_id)
        resolved, overrides = resolve_options(problem, existing, given)
        if not resolved.policy:
            resolved = replace(resolved, policy=DEFAULT_POLICY)
        sandbox_impl = make_sandbox(resolved.sandbox, workers=resolved.workers)
        refusal = weak_sandbox_refusal(sandbox_impl, problem, resolved.allow_weak_sandbox)
        if refusal is not None:
            sandbox_impl.close()
            raise SearchSetupError(refusal)
        policy_impl = make_policy(resolved.policy)
    except (ArchiveError, RunMismatch, SandboxUnavailable, SandboxRefused, PolicyError) as exc:
        raise SearchSetupError(str(exc)) from exc
    previous = existing.status if existing is not None else None
    run_row, resumed = open_run(archive, problem, resolved, run=existing, overrides=overrides)
    restored = restore_latest_adapter(archive, run_row.id, policy_impl)
    train_step, where = None, None
    if resolved.train_every:
        where = Path(resolved.adapters_dir) if resolved.adapters_dir else adapters_next_to(target_db, problem.name)
        try:
            trainer = ArchiveTrainer(
                archive,
                run_row.id,
                list(problem.components),
                resolved.variants,
                policy_impl,
                TrainConfig(method=resolved.train_method, learning_rate=resolved.learning_rate),
                where,
                trainer_model=resolved.trainer_model,
            )
        except (TrainingUnsupported, PolicyError) as exc:
            sandbox_impl.close()
            raise SearchSetupError(str(exc)) from exc
        train_step = trainer.step
    loop = SearchLoop(problem, archive, policy_impl, sandbox_impl, run_row, resolved, train_step)
    return Search(loop, target_db, resumed, restored, where, previous, overrides)
