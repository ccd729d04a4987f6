"""The Python API: `build_search` wires a problem, an archive, a policy and a sandbox into a runnable search.

`evolve run` is this function plus flag checks, a live view and an exit code; a library user calls it directly:

    from evolve.problem import load_problem
    from evolve.runs import RunOptions
    from evolve.search import build_search

    problem = load_problem("problems/circle_packing")
    options = RunOptions.for_problem(problem.config.search, max_evaluations=50, policy="transformers:embedded")
    search = build_search(problem, options, db="runs/circle.db", sandbox="process")
    try:
        print(search.run())          # why it stopped; the archive holds everything it found
    finally:
        search.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evolve.archive import Archive, ArchiveError, archive_url, sqlite_file
from evolve.loop import SearchLoop, run_search
from evolve.problem import Problem
from evolve.runs import RunMismatch, RunOptions, check_resumable, open_run
from evolve.training import ArchiveTrainer, TrainingUnsupported, restore_latest_adapter
from policies.base import Policy, PolicyError
from policies.factory import make_policy
from policies.trainer import TrainConfig
from sandboxes.base import Sandbox, SandboxRefused
from sandboxes.factory import SandboxUnavailable, make_sandbox

DEFAULT_POLICY = "transformers:embedded"


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


def _open_parts(
    problem: Problem, options: RunOptions, db: str | Path, policy: str, sandbox: str, allow_weak_sandbox: bool
) -> tuple[Archive, Sandbox, Policy]:
    """Quick checks first; the policy (slow for local models) after every quick check, before any write."""
    try:
        archive = Archive(db)
        check_resumable(archive, problem)
        sandbox_impl = make_sandbox(sandbox, workers=options.workers)
        if problem.form == "split" and not sandbox_impl.hides_files and not allow_weak_sandbox:
            sandbox_impl.close()
            raise SearchSetupError(
                f"{sandbox_impl.isolation()}; candidates could read {problem.name}'s expected answers. "
                "Install bubblewrap or start Docker, or pass --allow-weak-sandbox to accept this"
            )
        policy_impl = make_policy(policy)
    except (ArchiveError, RunMismatch, SandboxUnavailable, SandboxRefused, PolicyError) as exc:
        raise SearchSetupError(str(exc)) from exc
    return archive, sandbox_impl, policy_impl


def build_search(
    problem: Problem,
    options: RunOptions,
    *,
    db: str | Path | None = None,
    sandbox: str = "auto",
    learning_rate: float = 2e-5,
    adapters_dir: Path | None = None,
    trainer_model: str | None = None,
    allow_weak_sandbox: bool = False,
) -> Search:
    """Open (or create) the archive, start or resume the problem's run, load the policy and the sandbox, and
    set up training when `options.train_every` > 0. The policy is `options.policy` (a spec such as
    `transformers:embedded`, see `policies.factory`). Raises `SearchSetupError` with a one-line fix."""
    target_db = db if db is not None else default_db(problem)
    spec = options.policy or DEFAULT_POLICY
    archive, sandbox_impl, policy_impl = _open_parts(problem, options, target_db, spec, sandbox, allow_weak_sandbox)
    run_row, resumed = open_run(archive, problem, options)
    restored = restore_latest_adapter(archive, run_row.id, policy_impl)
    train_step, where = None, None
    if options.train_every:
        where = adapters_dir or adapters_next_to(target_db, problem.name)
        try:
            trainer = ArchiveTrainer(
                archive,
                run_row.id,
                list(problem.components),
                options.variants,
                policy_impl,
                TrainConfig(method=options.train_method, learning_rate=learning_rate),
                where,
                trainer_model=trainer_model,
            )
        except (TrainingUnsupported, PolicyError) as exc:
            sandbox_impl.close()
            raise SearchSetupError(str(exc)) from exc
        train_step = trainer.step
    loop = SearchLoop(problem, archive, policy_impl, sandbox_impl, run_row, options, train_step)
    return Search(loop, target_db, resumed, restored, where)
