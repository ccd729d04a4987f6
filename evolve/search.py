"""The Python API: `build_search` wires a problem, an archive, a policy and a sandbox into a runnable search.

`evolve run` is this function plus flag checks, a live view and an exit code; a library user calls it directly:

    from evolve.options import RunOverrides
    from evolve.problem import load_problem
    from evolve.search import build_search

    problem = load_problem("problems/circle_packing")
    search = build_search(problem, RunOverrides(max_evaluations=50, sandbox="process"), db="runs/circle.db")
    try:
        print(search.run())          # why it stopped; the archive holds everything it found
    finally:
        search.close()               # the policy, the sandbox and the archive

A new run takes the overrides over the problem's `[search]` and the defaults; a resume takes the stored options
and records each given value that differs as an override (`RunOverrides.of(options)` gives a `RunOptions` whole).

Several policies drive one run as an ensemble (evolve.members, evolve.ensemble):

    search = build_search(problem, RunOverrides(max_evaluations=50), db="runs/c.db",
                          policies=["embedded[temperature=0.6]", "embedded[temperature=1.1,name=hot]"])
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from evolve.archive import (
    Archive,
    ArchiveError,
    RunRecord,
    SessionLock,
    StorageError,
    archive_url,
    sqlite_file,
    storage_reason,
)
from evolve.ask_arms import AskError, ask_arms
from evolve.bandit import AllocationError, Allocator
from evolve.ensemble import COST_UNIT, EnsembleError
from evolve.loop import SearchLoop, run_search
from evolve.members import MemberError, MemberSpec, as_options
from evolve.options import RunOptions, RunOverrides
from evolve.problem import Problem
from evolve.problem.timeout_rule import RunTimeout
from evolve.runs import RunMismatch, check_resumable, open_run, resolve_options
from evolve.training import ArchiveTrainer, TrainingUnsupported, restore_latest_adapter
from policies.core_share import SharesCores
from policies.from_spec import make_policy
from policies.policy import Policy, PolicyError
from policies.trainer import TrainConfig
from sandboxes.backends import SandboxUnavailable, make_sandbox, weak_sandbox_refusal
from sandboxes.cpu_share import CountsEvaluations
from sandboxes.sandbox import Sandbox, SandboxRefused

SETUP_ERRORS = (
    ArchiveError,
    RunMismatch,
    SandboxUnavailable,
    SandboxRefused,
    PolicyError,
    TrainingUnsupported,
    MemberError,
    AskError,
    AllocationError,
    EnsembleError,
)


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
    notes: tuple[str, ...] = ()  # what the resume found to say (the folder moved, ...): evolve.runs.OpenedRun

    @property
    def archive(self) -> Archive:
        return self.loop.archive

    @property
    def policy(self) -> Policy:
        return self.loop.policy

    @property
    def sandbox(self) -> Sandbox:
        return self.loop.sandbox

    @property
    def policies(self) -> list[Policy]:
        """Each member's policy, in the members' order (members of one spec may share one)."""
        return [m.policy for m in self.loop.members]

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


def with_policies(
    overrides: RunOverrides | None, policies: Sequence[str | MemberSpec | Mapping[str, object]] | None
) -> RunOverrides:
    """The overrides with the members given (`--policy` texts, `MemberSpec`s or `[[search.policies]]`-like tables)."""
    given = overrides if overrides is not None else RunOverrides()
    if not policies:
        return given
    try:
        return replace(given, **as_options(policies))
    except MemberError as exc:
        raise SearchSetupError(str(exc)) from exc


@dataclass
class MemberPolicies:
    """The loaded policies of a run's members, by member name, with their training steps and what could not train."""

    policies: dict[str, Policy] = field(default_factory=dict)
    train_steps: dict[str, object] = field(default_factory=dict)
    untrainable: dict[str, str] = field(default_factory=dict)
    restored: int | None = None


def check_ensemble(options: RunOptions) -> list[MemberSpec]:
    """The run's members, its ask arms, allocation and cost checked before anything is loaded or written."""
    ask_arms(options.asks)
    Allocator(options.allocation)
    if options.bandit_cost not in COST_UNIT:
        raise EnsembleError(f"bandit cost {options.bandit_cost!r}: use one of {', '.join(COST_UNIT)}")
    return options.members()


def _load_members(opened: contextlib.ExitStack, members: list[MemberSpec], *, share: bool) -> dict[str, Policy]:
    """One policy per member; members of one spec share one loaded model when `share` (nothing trains and no
    member has adapters of its own to serve again), else each has its own copy."""
    loaded: dict[str, Policy] = {}
    by_name: dict[str, Policy] = {}
    for m in members:
        key = m.spec if share else m.name
        if key not in loaded:
            policy = make_policy(m.spec, env_key=m.env_key)  # no key to a problem folder's server unless trusted
            loaded[key] = policy
            opened.callback(policy.close)
        by_name[m.name] = loaded[key]
    return by_name


def _trainers(
    archive: Archive, run: RunRecord, problem: Problem, options: RunOptions, where: Path, members: MemberPolicies
) -> None:
    """A training step per trainable member (its adapters in `where`, or `where/NAME` when there are several);
    a member that cannot train says why once. With one member, or none trainable, that is a setup error."""
    names = list(members.policies)
    for i, name in enumerate(names):
        folder = member_folder(where, names, name)
        try:
            trainer = ArchiveTrainer(
                archive,
                run.id,
                list(problem.components),
                options.variants,
                members.policies[name],
                train_config(options),
                folder,
                trainer_model=options.trainer_model,
                member=name,
                first=i == 0,
            )
        except TrainingUnsupported as exc:
            if len(names) == 1:
                raise
            members.untrainable[name] = str(exc)
            continue
        members.train_steps[name] = trainer.step
    if not members.train_steps:
        reasons = "; ".join(f"{n}: {why}" for n, why in members.untrainable.items())
        raise TrainingUnsupported(f"no member of the ensemble can be trained ({reasons}); drop --train-every")


def train_config(options: RunOptions, **changes: Any) -> TrainConfig:
    """The update settings a run's options ask for (`changes`: what `evolve train` sets itself)."""
    config = TrainConfig(
        method=options.train_method,
        learning_rate=options.learning_rate,
        epochs=options.train_epochs,
        kl_coef=options.kl_coef,
        skip_zero_advantage=options.skip_zero_advantage,
        lazy_penalty=options.lazy_penalty,
        reward_normalisation=options.reward_normalisation,
    )
    return replace(config, **changes)


def member_folder(where: Path, names: Sequence[str], name: str) -> Path:
    """Where a member's adapters go: `where` itself with one member, else a folder named after the member."""
    return where if len(names) == 1 else where / "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:80]


def build_search(
    problem: Problem,
    overrides: RunOverrides | None = None,
    *,
    db: str | Path | None = None,
    run_id: int | None = None,
    policies: Sequence[str | MemberSpec | Mapping[str, object]] | None = None,
) -> Search:
    """Open (or create) the archive at `db` (default `runs/NAME.db`), start or resume the problem's run (the
    latest, or `run_id`), load the sandbox and the policies, and set up training when `train_every` > 0.

    The search owns what it opens: a failure part-way closes everything opened so far, and `Search.close`
    closes all of it. A policy is a spec such as `embedded` or `transformers:DIR` (see `policies.from_spec`);
    `policies` makes an ensemble of several (evolve.members), as `--policy A --policy B` does.
    Raises `SearchSetupError` with a one-line fix."""
    given = with_policies(overrides, policies)
    target_db = db if db is not None else default_db(problem)
    with contextlib.ExitStack() as opened:
        try:  # quick checks first; the policy (slow for local models) after them, before any write
            archive = Archive(target_db)
            session_lock = SessionLock(archive.db, problem.name)
            opened.callback(session_lock.release)  # after the archive's close (callbacks run last first)
            opened.callback(archive.close)
            session_lock.acquire()  # before the run to resume is looked for: a second live session is refused
            existing = check_resumable(archive, problem, run_id)
            chosen = resolve_options(problem, existing, given)
            resolved, changes = chosen.options, chosen.changes
            specs = check_ensemble(resolved)
            sandbox = make_sandbox(resolved.sandbox, workers=resolved.workers)
            opened.callback(sandbox.close)
            refusal = weak_sandbox_refusal(sandbox, problem, resolved.allow_weak_sandbox)
            if refusal is not None:
                raise SearchSetupError(refusal)
            trained = existing is not None and any(v.adapter_path for v in archive.policy_versions(existing.id))
            with contextlib.ExitStack() as policies_opened:  # closed here only if setup fails past this point
                members = MemberPolicies(
                    _load_members(policies_opened, specs, share=not resolved.train_every and not trained)
                )
                for policy in members.policies.values():  # decoding here leaves a core to each evaluation here
                    if isinstance(policy, SharesCores) and isinstance(sandbox, CountsEvaluations):
                        policy.share_cores(sandbox.evaluations_in_flight)
                session = open_run(archive, problem, resolved, run=existing, overrides=changes)
                run_row, resumed = session.run, session.resumed
                for i, spec in enumerate(specs):
                    number = restore_latest_adapter(archive, run_row.id, members.policies[spec.name], spec.name, i == 0)
                    members.restored = number if members.restored is None else members.restored
                where = None
                if resolved.train_every:
                    where = Path(resolved.adapters_dir or adapters_next_to(target_db, problem.name))
                    _trainers(archive, run_row, problem, resolved, where, members)
                loop = SearchLoop(
                    problem,
                    archive,
                    members.policies,
                    sandbox,
                    run_row,
                    resolved,
                    train_steps=members.train_steps,  # type: ignore[arg-type]
                    untrainable=members.untrainable,
                )
                loop.keep_session = session_lock.keep
                loop.timeout = RunTimeout(problem, resolved.timeout_s, archive, run_row)
                policies_opened.pop_all()
            opened.callback(loop.close_policy)
        except SETUP_ERRORS as exc:
            raise SearchSetupError(str(exc)) from exc
        except StorageError as exc:  # the archive opened, but a write failed (a read-only file, a full disk)
            raise SearchSetupError(
                f"{target_db}: cannot write the archive ({storage_reason(exc)}); check the file's and its folder's "
                "permissions and free space"
            ) from exc
        previous = existing.status if existing is not None else None
        restored = members.restored
        return Search(loop, target_db, resumed, restored, where, previous, changes, opened.pop_all(), session.notes)
