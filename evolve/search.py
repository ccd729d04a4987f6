"""The Python API: `build_search` wires a problem, an archive, a policy and a sandbox into a runnable search.

`evolve run` is this function plus flag checks, a live view and an exit code; a library user calls it directly:

    from evolve.problem import load_problem
    from evolve.runs import RunOverrides
    from evolve.search import build_search

    problem = load_problem("problems/circle_packing")
    search = build_search(problem, RunOverrides(max_evaluations=50, sandbox="process"), db="runs/circle.db")
    try:
        print(search.run())          # why it stopped; the archive holds everything it found
    finally:
        search.close()               # the policy, the sandbox and the archive

A new run takes the overrides over the problem's `[search]` and the defaults; a resume takes the stored options
and records each given value that differs as an override (`RunOverrides.of(options)` gives a `RunOptions` whole).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.archive import Archive, ArchiveError, archive_url, sqlite_file
from evolve.loop import SearchLoop, run_search
from evolve.problem import Problem
from evolve.runs import RunMismatch, RunOverrides, check_resumable, open_run, resolve_options
from evolve.training import ArchiveTrainer, TrainingUnsupported, restore_latest_adapter
from policies.base import Policy, PolicyError
from policies.factory import make_policy
from policies.trainer import TrainConfig
from sandboxes.base import Sandbox, SandboxRefused
from sandboxes.factory import SandboxUnavailable, make_sandbox, weak_sandbox_refusal

SETUP_ERRORS = (ArchiveError, RunMismatch, SandboxUnavailable, SandboxRefused, PolicyError, TrainingUnsupported)


class SearchSetupError(Exception):
    """The search cannot start; `str()` says what to fix. Nothing was written that a retry would not reuse."""


@dataclass
class Search:
    """A wired search, ready to run (or resume). `run()` returns why it stopped; `close()` closes what
    `build_search` opened (the policy, the sandbox and the archive)."""

    loop: SearchLoop
    db: str | Path
    resumed: bool
    restored_version: int | None  # the trained policy version served again on resume, if any
    adapters_dir: Path | None  # where new adapters go when training is on
    previous_status: str | None = None  # the run's status before this session (running = it was killed)
    overrides: Mapping[str, list[Any]] | None = None  # options changed on this resume: name → [stored, given]
    opened: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

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
        """Close the policy, the sandbox and the archive (the reverse of their opening); safe to call twice."""
        self.opened.close()


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
    overrides: RunOverrides | None = None,
    *,
    db: str | Path | None = None,
    run_id: int | None = None,
) -> Search:
    """Open (or create) the archive at `db` (default `runs/NAME.db`), start or resume the problem's run (the
    latest, or `run_id`), load the sandbox and the policy, and set up training when `train_every` > 0.

    The search owns what it opens: a failure part-way closes everything opened so far, and `Search.close`
    closes all of it. The policy is a spec such as `embedded` or `transformers:DIR` (see `policies.factory`).
    Raises `SearchSetupError` with a one-line fix."""
    given = overrides if overrides is not None else RunOverrides()
    target_db = db if db is not None else default_db(problem)
    loop: SearchLoop | None = None
    with contextlib.ExitStack() as opened:
        try:  # quick checks first; the policy (slow for local models) after them, before any write
            archive = Archive(target_db)
            opened.callback(archive.close)
            existing = check_resumable(archive, problem, run_id)
            resolved, changes = resolve_options(problem, existing, given)
            sandbox = make_sandbox(resolved.sandbox, workers=resolved.workers)
            opened.callback(sandbox.close)
            refusal = weak_sandbox_refusal(sandbox, problem, resolved.allow_weak_sandbox)
            if refusal is not None:
                raise SearchSetupError(refusal)
            policy = make_policy(resolved.policy)
            opened.callback(lambda: policy.close() if loop is None else loop.close_policy())
            run_row, resumed = open_run(archive, problem, resolved, run=existing, overrides=changes)
            restored = restore_latest_adapter(archive, run_row.id, policy)
            train_step, where = None, None
            if resolved.train_every:
                where = Path(resolved.adapters_dir or adapters_next_to(target_db, problem.name))
                trainer = ArchiveTrainer(
                    archive,
                    run_row.id,
                    list(problem.components),
                    resolved.variants,
                    policy,
                    TrainConfig(method=resolved.train_method, learning_rate=resolved.learning_rate),
                    where,
                    trainer_model=resolved.trainer_model,
                )
                train_step = trainer.step
        except SETUP_ERRORS as exc:
            raise SearchSetupError(str(exc)) from exc
        loop = SearchLoop(problem, archive, policy, sandbox, run_row, resolved, train_step)
        previous = existing.status if existing is not None else None
        return Search(loop, target_db, resumed, restored, where, previous, changes, opened.pop_all())
