"""`evolve train`: update a run's policy offline from the groups already in its archive."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from evolve.cli.archive_cmds import RunOpt, open_archive, pick_run
from evolve.cli.common import DbArg, console, default_note, fail
from evolve.cli.option_flags import Borrowed, option_parameters, with_flags
from evolve.members import MemberError
from evolve.options import RunOverrides, invalid_value, option_default
from evolve.problem.config import FitnessSection
from evolve.runs import stored_options
from evolve.search import adapters_next_to, member_folder, train_config
from evolve.training import ArchiveTrainer, TrainingUnsupported, restore_latest_adapter
from policies.from_spec import make_policy
from policies.policy import PolicyError

# The options `evolve train` takes from the run's options (evolve/options.py), each shown as `evolve run` shows it
# unless said otherwise here: `--method` names `train_method`; `--policy` defaults to the run's. A method or
# learning rate not given is the option's default; reward shaping not given is the run's own.
BORROWED = {
    "policy": Borrowed(default="the run's policy"),
    "train_method": Borrowed(flag="method"),
    "learning_rate": Borrowed(),
    "adapters_dir": Borrowed(),
    "trainer_model": Borrowed(),
    "skip_zero_advantage": Borrowed(),
    "lazy_penalty": Borrowed(),
    "reward_normalisation": Borrowed(),
}
SHAPING = ("skip_zero_advantage", "lazy_penalty", "reward_normalisation")


def train(
    db: DbArg,
    steps: Annotated[int, typer.Option(min=1, help="updates; each writes a policy version")] = 1,
    run: RunOpt = None,
    member: Annotated[str | None, typer.Option(help=default_note("the run's first policy member"))] = None,
    **flags: Any,
) -> None:
    """Train the policy with VPO (or GRPO / Multi-RLVR) on the archive's own groups (with an ensemble: one
    member's, from its own version lineage). Reward shaping not given here is the run's own."""
    given = RunOverrides(**flags)
    said = invalid_value(flags, {name: b.flag for name, b in BORROWED.items() if b.flag})
    if said:
        fail(said)
    archive = open_archive(db)
    chosen = pick_run(archive, run)
    try:
        stored = stored_options(chosen)
        members = stored.members()
    except MemberError as exc:
        fail(f"{db}: run {chosen.id}: {exc}")
    names = [m.name for m in members]
    if member is not None and member not in names:
        fail(f"--member {member}: run {chosen.id} has members {', '.join(names)}")
    index = names.index(member) if member is not None else 0
    spec = given.policy or members[index].spec
    components = list(FitnessSection.model_validate(chosen.config["problem"]["fitness"]).resolved())
    try:
        policy_impl = make_policy(spec, env_key=given.policy is not None or members[index].env_key)
    except PolicyError as exc:
        fail(str(exc))
    restore_latest_adapter(archive, chosen.id, policy_impl, names[index], index == 0)
    config = train_config(
        stored,
        method=given.train_method or option_default("train_method"),
        learning_rate=option_default("learning_rate") if given.learning_rate is None else given.learning_rate,
        versions_back=10**6,
        **{k: getattr(given, k) for k in SHAPING if getattr(given, k) is not None},
    )
    where = Path(given.adapters_dir) if given.adapters_dir else adapters_next_to(db, chosen.problem_name)
    try:
        trainer = ArchiveTrainer(
            archive,
            chosen.id,
            components,
            stored.variants,
            policy_impl,
            config,
            member_folder(where, names, names[index]),
            trainer_model=given.trainer_model,
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
    own = [p for p in inspect.signature(train, eval_str=True).parameters.values() if p.kind is not p.VAR_KEYWORD]
    app.command()(with_flags(train, own, option_parameters("train", BORROWED)))
