"""`evolve train`: update a run's policy offline from the groups already in its archive."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated

import typer

from evolve.cli.archive_cmds import RunOpt, open_archive, pick_run
from evolve.cli.common import DbArg, console, default_note, fail, one_of
from evolve.cli.option_flags import option_parameters, with_flags
from evolve.members import MemberError
from evolve.options import invalid_value
from evolve.problem.config import FitnessSection
from evolve.runs import TRAIN_METHODS, option_default, stored_options
from evolve.search import adapters_next_to, member_folder, train_config
from evolve.training import ArchiveTrainer, TrainingUnsupported, restore_latest_adapter
from policies.from_spec import make_policy
from policies.policy import PolicyError

# The flags `evolve train` takes from the run's options model (evolve/options.py), as `evolve run` shows them.
SHARED_FLAGS = ("learning_rate", "skip_zero_advantage", "lazy_penalty", "reward_normalisation")


def _train_own(
    db: DbArg,
    method: Annotated[str, typer.Option(help=" | ".join(TRAIN_METHODS))] = option_default("train_method"),
    steps: Annotated[int, typer.Option(min=1, help="updates; each writes a policy version")] = 1,
    policy: Annotated[str | None, typer.Option(help=default_note("the run's policy"))] = None,
    adapters_dir: Annotated[Path | None, typer.Option(help=default_note("next to the archive"))] = None,
    trainer_model: Annotated[str | None, typer.Option(help="local copy of a served base model")] = None,
    run: RunOpt = None,
    member: Annotated[str | None, typer.Option(help=default_note("the run's first policy member"))] = None,
) -> None: ...


def train(
    db: str,
    method: str = option_default("train_method"),
    steps: int = 1,
    policy: str | None = None,
    adapters_dir: Path | None = None,
    trainer_model: str | None = None,
    run: int | None = None,
    member: str | None = None,
    learning_rate: float | None = None,
    skip_zero_advantage: bool | None = None,
    lazy_penalty: float | None = None,
    reward_normalisation: str | None = None,
) -> None:
    """Train the policy with VPO (or GRPO / Multi-RLVR) on the archive's own groups (with an ensemble: one
    member's, from its own version lineage). Reward shaping not given here is the run's own."""
    if method not in TRAIN_METHODS:
        fail(f"--method {method}: use {one_of(TRAIN_METHODS)}")
    given = {"learning_rate": learning_rate, "lazy_penalty": lazy_penalty, "reward_normalisation": reward_normalisation}
    said = invalid_value(given)
    if said:
        fail(said)
    archive = open_archive(db)
    chosen = pick_run(archive, run)
    options = chosen.config.get("options", {})
    try:
        members = stored_options(chosen).members()
    except MemberError as exc:
        fail(f"{db}: run {chosen.id}: {exc}")
    names = [m.name for m in members]
    if member is not None and member not in names:
        fail(f"--member {member}: run {chosen.id} has members {', '.join(names)}")
    index = names.index(member) if member is not None else 0
    spec = policy or members[index].spec
    components = list(FitnessSection.model_validate(chosen.config["problem"]["fitness"]).resolved())
    try:
        policy_impl = make_policy(spec, env_key=policy is not None or members[index].env_key)
    except PolicyError as exc:
        fail(str(exc))
    restore_latest_adapter(archive, chosen.id, policy_impl, names[index], index == 0)
    shaping = {
        "skip_zero_advantage": skip_zero_advantage,
        "lazy_penalty": lazy_penalty,
        "reward_normalisation": reward_normalisation,
    }
    config = train_config(
        stored_options(chosen),
        method=method,
        learning_rate=option_default("learning_rate") if learning_rate is None else learning_rate,
        versions_back=10**6,
        **{k: v for k, v in shaping.items() if v is not None},
    )
    try:
        trainer = ArchiveTrainer(
            archive,
            chosen.id,
            components,
            int(options.get("variants", 3)),
            policy_impl,
            config,
            member_folder(adapters_dir or adapters_next_to(db, chosen.problem_name), names, names[index]),
            trainer_model=trainer_model,
            member=names[index],
            first=index == 0,
        )
    except (TrainingUnsupported, PolicyError) as exc:
        fail(str(exc))
    for step in range(steps):
        try:
            stats = trainer.step()
        except Exception as exc:  # the step undid itself: no version row, no adapter directory
            kept = f"v{policy_impl.version} stays served"
            fail(f"update {step + 1} failed ({type(exc).__name__}: {exc}); nothing was recorded, {kept}")
        if stats.samples == 0:
            fail(f"{db}: nothing to train on (skipped: {stats.skipped}); run a search with a transformers policy first")
        console.print(
            f"update {step + 1}: policy v{policy_impl.version}, {stats.groups} groups, {stats.samples} "
            f"completions, {stats.tokens} tokens, loss {stats.loss:.4g}, clip {stats.clip_fraction:.3f}, "
            f"set reward {stats.set_reward_mean:.3f}±{stats.set_reward_std:.3f}, "
            f"diversity {stats.reward_diversity:.3f}, skipped {stats.skipped}",
            highlight=False,
        )


def register(app: typer.Typer) -> None:
    own = list(inspect.signature(_train_own, eval_str=True).parameters.values())
    app.command()(with_flags(train, own, option_parameters("train", SHARED_FLAGS)))
