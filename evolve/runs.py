"""A run's identity across sessions: its options, and finding the run that `evolve run` resumes."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from evolve.archive import Archive
from evolve.archive.models import Run
from evolve.problem import Problem
from evolve.problem.config import SearchSection


class RunMismatch(Exception):
    pass


_SEARCH = SearchSection()  # the defaults' one home


@dataclass(frozen=True)
class RunOptions:
    """What one `evolve run` was asked for; stored with the run. Search defaults come from `SearchSection`."""

    workers: int = 2  # evaluations in flight at once
    group_size: int = _SEARCH.group_size  # completions per prompt (G)
    variants: int = _SEARCH.variants  # variants per completion (m)
    max_evaluations: int = _SEARCH.max_evaluations  # budget, summed over resumes
    max_time_s: float | None = None  # wall-clock budget in seconds, summed over resumes
    target: float | None = None  # stop once the best scalar view reaches this
    seed: int = 0  # seeds selection and sampling, group by group
    edit_format: str = _SEARCH.edit_format  # diff | full
    temperature: float = _SEARCH.temperature
    max_new_tokens: int = _SEARCH.max_new_tokens
    policy: str = ""  # the policy spec, e.g. transformers:embedded (so `evolve train` can load it again)
    train_every: int = 0  # groups between policy updates; 0 = never
    train_method: str = "vpo"  # vpo | grpo | multi-rlvr
    top_p: float = _SEARCH.top_p

    @classmethod
    def for_problem(cls, search: SearchSection, **given: Any) -> RunOptions:
        """Options for a problem: what was given (None = not given), else the problem's `[search]` values."""
        from_search = {
            name: getattr(search, name)
            for name in (
                "group_size",
                "variants",
                "max_evaluations",
                "edit_format",
                "temperature",
                "max_new_tokens",
                "top_p",
            )
        }
        chosen = {k: v for k, v in given.items() if v is not None}
        return cls(**{**from_search, **chosen})


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
