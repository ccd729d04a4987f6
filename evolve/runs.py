"""A run's identity across sessions: its options, and finding the run that `evolve run` resumes.

Every option is stored with the run when it starts. A resume takes the stored options; an option given
explicitly on resume overrides its stored value, and each override is recorded with the run (shown by
`evolve inspect`), so that leaving out `--max-evaluations 1000` on resume never silently shrinks the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evolve.archive import Archive, ArchiveError
from evolve.archive.models import Run
from evolve.members import MemberSpec, members_from
from evolve.problem import Problem
from evolve.problem.config import SearchSection, TrainingSection
from policies.advantages import METHODS as TRAIN_METHODS
from policies.factory import anchored_spec


class RunMismatch(Exception):
    pass


_SEARCH = SearchSection()  # the defaults' one home
_TRAINING = TrainingSection()
DEFAULT_POLICY = "embedded"  # the embedded model on llama.cpp where it is installed, else transformers


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
    edit_format: str = _SEARCH.edit_format  # auto | diff | full
    temperature: float = _SEARCH.temperature
    max_new_tokens: int = _SEARCH.max_new_tokens
    fit_tokens_to_code: bool = _SEARCH.fit_tokens_to_code  # max_new_tokens is a ceiling, fitted to the parent
    policy: str = DEFAULT_POLICY  # the policy spec, e.g. transformers:embedded (so `evolve train` can load it)
    train_every: int = 0  # groups between policy updates; 0 = never
    train_method: str = TRAIN_METHODS[0]  # one of policies.advantages.METHODS
    top_p: float = _SEARCH.top_p
    sandbox: str = "auto"  # auto | docker | process | ray[:ADDRESS]
    allow_weak_sandbox: bool = False  # run a split-form problem on a sandbox that cannot hide its answers
    learning_rate: float = 2e-5  # of the LoRA updates
    adapters_dir: str | None = None  # where adapters go (None: next to the archive)
    trainer_model: str | None = None  # local dir or hub id of the served base model (vllm:/openai: policies)
    patience: int | None = None  # stop after this many evaluations without a new best scalar
    stop_when_solved: bool = True  # stop once one program scores every component at its best declared bound
    max_failures: int = 5  # the same unexpected failure this many times in a row stops the run
    stall_groups: int = 6  # groups in a row without a new child that end the run (evolve.stopping.Stall); 0: never
    template: str = "directed"  # the prompt template a member asks with unless it sets its own
    max_groups: int | None = None  # stop generating after this many groups (fixed-size benchmark runs)
    # The ensemble (evolve.members, evolve.ensemble): members as stored tables; empty = the one `policy`.
    policies: list[dict[str, Any]] = field(default_factory=list)
    allocation: str = "bandit"  # bandit | uniform | weights: how groups are shared among members
    asks: str = "base,hotter,template,full"  # the ask arms tried beside the members (evolve.adapt); base: fixed
    bandit_cost: str = "tokens"  # tokens | seconds: what a group costs its member and ask
    # How an update shapes rewards (policies/shaping.py); defaults from the problem's `[training]`.
    skip_zero_advantage: bool = _TRAINING.skip_zero_advantage
    lazy_penalty: float = _TRAINING.lazy_penalty
    reward_normalisation: str = _TRAINING.reward_normalisation

    def members(self) -> list[MemberSpec]:
        """The members sampling this run's groups (one, `policy`, unless `policies` lists several)."""
        return members_from(self.policy, self.policies)

    @classmethod
    def for_problem(
        cls, search: SearchSection, training: TrainingSection | None = None, *, root: Path | None = None, **given: Any
    ) -> RunOptions:
        """Options for a problem: what was given (None = not given), else the problem's `[search]` and
        `[training]` values. A relative file in a `[[search.policies]]` spec is the problem folder's (`root`),
        like its seed, and is stored absolute: read from the working directory, it named another file, or none."""
        from_search = {
            name: getattr(search, name)
            for name in (
                "group_size",
                "variants",
                "max_evaluations",
                "edit_format",
                "temperature",
                "max_new_tokens",
                "fit_tokens_to_code",
                "top_p",
            )
        }
        from_search.update((training or _TRAINING).model_dump())
        listed = [m.model_dump(exclude_none=True) for m in search.policies]
        for member in listed if root is not None else ():
            member["spec"] = anchored_spec(member["spec"], root)
        if listed:
            from_search["policies"] = listed
            from_search["policy"] = listed[0]["spec"]
        chosen = {k: v for k, v in given.items() if v is not None}
        return cls(**{**from_search, **chosen})


def option_default(name: str) -> Any:
    """A `RunOptions` field's default, for help texts (so that they never repeat it)."""
    return next(f.default for f in fields(RunOptions) if f.name == name)


@dataclass(frozen=True)
class RunOverrides:
    """The options one `evolve run`/`resume` (or a library call) gives; None is "not given". A new run takes
    them over the problem's `[search]` and the defaults; a resume takes the stored options and records each given
    value that differs as an override. One field per `RunOptions` field (a test holds the two in step)."""

    workers: int | None = None
    group_size: int | None = None
    variants: int | None = None
    max_evaluations: int | None = None
    max_time_s: float | None = None
    target: float | None = None
    seed: int | None = None
    edit_format: str | None = None
    temperature: float | None = None
    max_new_tokens: int | None = None
    fit_tokens_to_code: bool | None = None
    policy: str | None = None
    train_every: int | None = None
    train_method: str | None = None
    top_p: float | None = None
    sandbox: str | None = None
    allow_weak_sandbox: bool | None = None
    learning_rate: float | None = None
    adapters_dir: str | None = None
    trainer_model: str | None = None
    patience: int | None = None
    stop_when_solved: bool | None = None
    max_failures: int | None = None
    stall_groups: int | None = None
    template: str | None = None
    max_groups: int | None = None
    policies: list[dict[str, Any]] | None = None
    allocation: str | None = None
    asks: str | None = None
    bandit_cost: str | None = None
    skip_zero_advantage: bool | None = None
    lazy_penalty: float | None = None
    reward_normalisation: str | None = None

    @classmethod
    def of(cls, options: RunOptions) -> RunOverrides:
        """Every option given: a `RunOptions` taken whole (on resume, each field that differs is an override)."""
        return cls(**asdict(options))

    def given(self) -> dict[str, Any]:
        """The options given, by name. `policy` and `policies` are two views of the members: either given
        alone sets the other (one policy is a one-member list; a list's first member is `policy`)."""
        chosen = {k: v for k, v in asdict(self).items() if v is not None}
        if "policies" in chosen and chosen["policies"] and "policy" not in chosen:
            chosen["policy"] = chosen["policies"][0]["spec"]
        if "policy" in chosen and "policies" not in chosen:
            chosen["policies"] = []
        return chosen


def check_resumable(archive: Archive, problem: Problem, run_id: int | None = None) -> Run | None:
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


def stored_options(run: Run) -> RunOptions:
    """The options a run was started with (fields unknown to an older archive take their defaults; an older
    archive's empty policy meant the default one)."""
    known = {f.name for f in fields(RunOptions)}
    raw = {k: v for k, v in run.config.get("options", {}).items() if k in known}
    if not raw.get("policy", DEFAULT_POLICY):
        raw["policy"] = DEFAULT_POLICY
    return RunOptions(**raw)


def resolve_options(
    problem: Problem, run: Run | None, overrides: RunOverrides
) -> tuple[RunOptions, dict[str, list[Any]]]:
    """A new run: what was given over the problem's `[search]`. A resume: the stored options, with each given
    value that differs as an override. Returns (options, overrides as name → [stored, given])."""
    chosen = overrides.given()
    if run is None:
        return RunOptions.for_problem(problem.config.search, problem.config.training, root=problem.root, **chosen), {}
    stored = stored_options(run)
    changes = {k: [getattr(stored, k), v] for k, v in chosen.items() if getattr(stored, k) != v}
    return replace(stored, **{k: new for k, (_old, new) in changes.items()}), changes


def open_run(
    archive: Archive,
    problem: Problem,
    options: RunOptions,
    *,
    run: Run | None = None,
    overrides: Mapping[str, list[Any]] | None = None,
) -> tuple[Run, bool]:
    """Resume `run` (default: the latest run of this problem) or start a new one; returns (run, resumed).

    A resumed run found `running` was killed (SIGKILL, power loss): it is counted as an interruption."""
    run = run if run is not None else check_resumable(archive, problem)
    if run is not None:
        config = {**run.config, "options": asdict(options)}
        if overrides:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            config["overrides"] = [*run.config.get("overrides", []), {"at": stamp, "changes": dict(overrides)}]
        state = dict(run.state)
        if run.status == "running":
            state["interruptions"] = int(state.get("interruptions", 0)) + 1
        archive.update_run(run.id, status="running", config=config, state=state)
        run.config, run.state = config, state
        return run, True
    config = {
        "problem": problem.config.model_dump(mode="json"),
        "problem_path": str(problem.root),
        "problem_hash": problem.fingerprint(),
        "options": asdict(options),
    }
    return archive.create_run(problem.name, str(problem.root), problem.fingerprint(), config, options.seed), False
