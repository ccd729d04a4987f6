"""A run's identity across sessions: its options, and finding the run that `evolve run` resumes."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from evolve.archive import Archive
from evolve.archive.models import Run
from evolve.problem import Problem


class RunMismatch(Exception):
    pass


@dataclass(frozen=True)
class RunOptions:
    workers: int = 2
    group_size: int = 4
    variants: int = 3
    max_evaluations: int = 200
    max_time_s: float | None = None
    target: float | None = None
    seed: int = 0
    edit_format: str = "diff"
    temperature: float = 0.8
    max_new_tokens: int = 768
    policy: str = ""
    train_every: int = 0  # groups between policy updates; 0 = never
    train_method: str = "vpo"
    template: str = "directed"  # prompt template (evolve.prompts.TEMPLATES); the adapter may change it
    adapt_every: int = 2  # barren groups before the ask changes
    stall_groups: int = 6  # barren groups in a row that end the run
    max_groups: int | None = None  # stop after this many groups (benchmarks use it for fixed-size runs)


def check_resumable(archive: Archive, problem: Problem) -> Run | None:
    """The run of this problem that `evolve run` would resume, refusing one made for a changed problem."""
    run = archive.latest_run(problem.name)
    if run is not None and run.problem_fingerprint != problem.fingerprint():
        raise RunMismatch(
            f"{archive.url}: run {run.id} of {problem.name} was made with a different "
            "problem.toml or evaluator; use a new --db to start afresh"
        )
    return run


def open_run(archive: Archive, problem: Problem, options: RunOptions) -> tuple[Run, bool]:
    """The latest run of this problem in the archive (resumed), or a new one. Returns (run, resumed)."""
    run = check_resumable(archive, problem)
    if run is not None:
        archive.update_run(run.id, status="running", config={**run.config, "options": asdict(options)})
        return run, True
    config = {"problem": problem.config.model_dump(mode="json"), "options": asdict(options)}
    return archive.create_run(problem.name, str(problem.root), problem.fingerprint(), config, options.seed), False
