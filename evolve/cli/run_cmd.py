"""`evolve run`: start or resume a search on a problem folder (the CLI face of `evolve.search.build_search`)."""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from sqlalchemy.exc import SQLAlchemyError

from evolve.adapt import ASK_ARMS
from evolve.bandit import ALLOCATIONS
from evolve.cli.archive_cmds import open_archive, pick_run
from evolve.cli.common import console, default_note, fail, one_of, shell_arg, vector_table
from evolve.cli.problem_cmds import load_or_fail
from evolve.cli.shaping_opts import LazyPenaltyOpt, NormalisationOpt, SkipZeroOpt, check_shaping
from evolve.ensemble import COST_UNIT
from evolve.fitness import raw_scores
from evolve.loop import SearchLoop
from evolve.members import MemberError, MemberSpec, as_options, parse_member
from evolve.problem import Problem
from evolve.runs import DEFAULT_POLICY, TRAIN_METHODS, RunOverrides, option_default
from evolve.sampling_feed import feed_sampling
from evolve.search import Search, SearchSetupError, build_search
from policies.base import Describing, PolicyError, ProgressReporting, StatusReporting
from policies.factory import anchored_spec

POLICY_HELP = (
    "embedded | llama:embedded | llama:PATH.gguf | transformers:embedded | transformers:DIR_OR_HUB_ID | "
    "vllm:URL[,URL2...][@MODEL] | openai:URL@MODEL | vllm-local:MODEL | replay:FILE; optionally followed by "
    "[temperature=T,top_p=P,template=T,edit_format=F,weight=W,name=N]; repeat it for an ensemble"
)
EDIT_FORMATS = ("auto", "diff", "full")
THE_PROBLEMS = default_note("the problem's")
METHODS_HELP = " | ".join(TRAIN_METHODS)
# Without a terminal, the seconds between two progress lines. An environment variable rather than a flag: it
# changes nothing a run records, and lets a test see several lines in a few seconds instead of a minute.
LINE_PERIOD_ENV = "EVOLVE_PROGRESS_EVERY_S"
DEFAULT_LINE_PERIOD_S = 10.0


def _default(name: str) -> str:
    """A help text's default, read from `RunOptions` (the defaults' one home)."""
    return default_note(option_default(name))


def _policy_status(loop: SearchLoop) -> str:
    said = [m.policy.status for m in loop.members if isinstance(m.policy, StatusReporting) and m.policy.status]
    return "; ".join(dict.fromkeys(said))


def _sampling(loop: SearchLoop) -> tuple[str, str]:
    """The group being sampled, as its member's policy counts it: (one line, a bar), or empty strings between
    groups."""
    for member in loop.members:
        if isinstance(member.policy, ProgressReporting) and member.policy.progress.active:
            return member.policy.progress.line(), member.policy.progress.bar()
    return "", ""


def line_period_s() -> float:
    """The seconds between progress lines without a terminal: $EVOLVE_PROGRESS_EVERY_S, else 10."""
    raw = os.environ.get(LINE_PERIOD_ENV)
    if raw is None:
        return DEFAULT_LINE_PERIOD_S
    try:
        period = float(raw)
    except ValueError:
        period = 0.0
    if not 0 < period < float("inf"):
        fail(f"{LINE_PERIOD_ENV}={raw!r}: give the seconds between progress lines as a positive number, or unset it")
    return period


def _live(loop: SearchLoop, done: threading.Event, period_s: float) -> None:
    """Redraw the live view twice a second in a terminal; elsewhere, a line every `period_s` (10 s unless set):
    the run's summary every third line, the group being sampled (its tokens so far) in between, so that a long
    group visibly advances."""
    if console.is_terminal:
        with Live(loop.stats.render(), console=console, refresh_per_second=2) as live:
            while not done.wait(0.5):
                loop.stats.policy_status = _policy_status(loop)
                loop.stats.sampling, loop.stats.sampling_bar = _sampling(loop)
                live.update(loop.stats.render())
    else:
        ticks = 0
        while not done.wait(period_s):
            ticks += 1
            status = _policy_status(loop)
            line, _bar = _sampling(loop)
            if ticks % 3 == 0 or not line:
                line = loop.stats.summary() + (f" [{line}]" if line else "")
            console.print(line + (f" [{status}]" if status else ""), highlight=False, markup=False)


def _announce(search: Search, problem: Problem) -> None:
    verb = "resuming" if search.resumed else "starting"
    console.print(f"{verb} run {search.loop.run.id} of {problem.name} in {search.archive.url}", highlight=False)
    if search.previous_status == "running":
        console.print(
            f"run {search.loop.run.id} was interrupted (its process was killed); resuming where it stopped",
            highlight=False,
        )
    for name, (old, new) in (search.overrides or {}).items():
        console.print(f"option {name}: {old!r} -> {new!r} (given on this resume; recorded with the run)")
    console.print(f"isolation: {search.sandbox.isolation()}", highlight=False)
    members = search.loop.members
    for member in members:
        policy = member.policy
        how = f" ({policy.description})" if isinstance(policy, Describing) else ""
        who = f"member {member.name}: " if len(members) > 1 else ""
        console.print(f"policy: {who}{policy.name}{how}", highlight=False, markup=False)
        if member.untrainable:
            console.print(f"member {member.name} is not trained: {member.untrainable}", highlight=False, markup=False)
    if len(members) > 1:
        options = search.loop.options
        console.print(
            f"ensemble: {len(members)} members, {options.allocation} allocation by value per {options.bandit_cost}"
        )
    if search.loop.ensemble.changes:
        console.print(search.loop.ensemble.changes, highlight=False, markup=False)
    if search.restored_version is not None:
        console.print(f"serving policy version {search.restored_version} (the run's newest adapter)")
    if search.adapters_dir is not None:
        options = search.loop.options
        zero = "skipped" if options.skip_zero_advantage else "kept"
        console.print(
            f"training: {options.train_method} every {options.train_every} groups (zero-advantage groups {zero}, "
            f"lazy penalty {options.lazy_penalty:g}, rewards by {options.reward_normalisation}); adapters in "
            f"{search.adapters_dir}",
            highlight=False,
        )


def _run_with_live_view(search: Search, period_s: float) -> str:
    """Run to the end; on a stop the archive keeps everything committed, and the same command resumes."""
    done = threading.Event()
    viewer = threading.Thread(target=_live, args=(search.loop, done, period_s), daemon=True)
    viewer.start()
    feed_args = (search.policies, search.archive, search.loop.run.id, done)
    feeder = threading.Thread(target=feed_sampling, args=feed_args, daemon=True)  # for `evolve serve`
    feeder.start()
    try:
        return search.run()
    except (PolicyError, SQLAlchemyError) as exc:  # everything committed so far stays; the same command resumes
        done.set()
        fail(f"the run stopped: {exc}; fix that, then run the same command to resume")
    except KeyboardInterrupt:
        done.set()
        console.print("interrupted; everything committed so far is kept. Run the same command to resume.")
        os._exit(130)
    finally:
        done.set()
        if search.loop.control.interrupted.is_set():
            _leave_on_another_signal()
        viewer.join(timeout=2)
        feeder.join(timeout=2)
        search.close()


def _leave_on_another_signal() -> None:
    """After a stop the run row is written and everything is committed: another Ctrl-C or SIGTERM while the
    policies and the sandbox close leaves at once (exit 130), rather than raising KeyboardInterrupt inside their
    close (a traceback, then interpreter shutdown with torch or llama.cpp objects half closed) or, for SIGTERM,
    killing the process by its default action."""

    def leave(signum: int, frame: object) -> None:
        os._exit(130)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, leave)


def _report(search: Search, reason: str, problem: Problem) -> None:
    loop = search.loop
    console.print(f"[bold]{reason}[/]: {loop.stats.summary()}", highlight=False)
    best = loop.population.best
    if best is not None:
        scores = raw_scores(problem.components, best.oriented)
        console.print(vector_table(scores, title=f"best program {best.id} (scalar {best.scalar:.6g})"))
        console.print(
            f"see it with: evolve best {shell_arg(search.db)}    or    evolve show {shell_arg(search.db)} {best.id}",
            highlight=False,
            markup=False,  # a folder named [x] is text, not a style
        )
    if loop.control.interrupted.is_set():
        # A forward pass cut short by Ctrl-C may still run in the policy's daemon thread; everything is committed,
        # so leave now rather than let interpreter shutdown tear torch down under it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run(
    problem_dir: Annotated[Path, typer.Argument(metavar="PROBLEM")],
    db: Annotated[
        str | None, typer.Option(help=f"archive path or SQLAlchemy URL {default_note('runs/NAME.db')}")
    ] = None,
    policy: Annotated[list[str] | None, typer.Option(help=f"{POLICY_HELP} {default_note(DEFAULT_POLICY)}")] = None,
    allocation: Annotated[
        str | None, typer.Option(help=f"{' | '.join(ALLOCATIONS)}: how members share groups {_default('allocation')}")
    ] = None,
    asks: Annotated[
        str | None,
        typer.Option(help=f"ask arms the bandit tries, of {','.join(ASK_ARMS)} (base alone: fixed) {_default('asks')}"),
    ] = None,
    bandit_cost: Annotated[
        str | None, typer.Option(help=f"{' | '.join(COST_UNIT)}: what a group costs {_default('bandit_cost')}")
    ] = None,
    sandbox: Annotated[
        str | None, typer.Option(help=f"auto | docker | process | ray[:ADDRESS] {_default('sandbox')}")
    ] = None,
    workers: Annotated[int | None, typer.Option(min=1, help=_default("workers"))] = None,
    group_size: Annotated[int | None, typer.Option(min=1, help="completions per prompt (G)")] = None,
    variants: Annotated[int | None, typer.Option(min=1, max=8, help="variants per completion (m)")] = None,
    max_evaluations: Annotated[int | None, typer.Option(min=1)] = None,
    max_time: Annotated[float | None, typer.Option(help="seconds, summed over resumes")] = None,
    target: Annotated[float | None, typer.Option(help="stop when the scalar view reaches this")] = None,
    patience: Annotated[int | None, typer.Option(min=1, help="stop after N evaluations without a new best")] = None,
    stop_when_solved: Annotated[
        bool | None,
        typer.Option(
            "--stop-when-solved/--no-stop-when-solved",
            help=f"stop once every component is at its best declared bound {default_note('stop')}",
        ),
    ] = None,
    seed: Annotated[int | None, typer.Option(help=_default("seed"))] = None,
    edit_format: Annotated[
        str | None,
        typer.Option(help=f"{' | '.join(EDIT_FORMATS)} (auto: rewrite short code whole) {THE_PROBLEMS}"),
    ] = None,
    temperature: Annotated[float | None, typer.Option(min=0.0)] = None,
    stall_groups: Annotated[
        int | None,
        typer.Option(min=1, help=f"stop after N groups in a row without a new child {_default('stall_groups')}"),
    ] = None,
    max_new_tokens: Annotated[int | None, typer.Option(min=16)] = None,
    fit_tokens_to_code: Annotated[
        bool | None,
        typer.Option(
            "--fit-tokens-to-code/--no-fit-tokens-to-code",
            help="cap max_new_tokens at what the answers for the parent's code need (off for reasoning models)",
        ),
    ] = None,
    train_every: Annotated[int | None, typer.Option(min=0, help="update the policy every N groups (0: never)")] = None,
    train_method: Annotated[str | None, typer.Option(help=f"{METHODS_HELP} {_default('train_method')}")] = None,
    learning_rate: Annotated[float | None, typer.Option(help=f"LoRA learning rate {_default('learning_rate')}")] = None,
    skip_zero_advantage: SkipZeroOpt = None,
    lazy_penalty: LazyPenaltyOpt = None,
    reward_normalisation: NormalisationOpt = None,
    adapters_dir: Annotated[Path | None, typer.Option(help=default_note("next to the archive"))] = None,
    trainer_model: Annotated[
        str | None, typer.Option(help="local dir or hub id of the served base model (for vllm:/openai: policies)")
    ] = None,
    max_failures: Annotated[
        int | None,
        typer.Option(min=1, help=f"stop when one failure repeats N times in a row {_default('max_failures')}"),
    ] = None,
    allow_weak_sandbox: Annotated[
        bool | None,
        typer.Option(
            "--allow-weak-sandbox/--no-allow-weak-sandbox",
            help="run a split-form problem although candidates could read its expected answers",
        ),
    ] = None,
) -> None:
    """Run (or resume) an evolutionary search. A resume reuses the options the run was started with; a flag
    given again overrides its stored value (recorded with the run). Ctrl-C stops cleanly."""
    problem = load_or_fail(problem_dir, sandbox or option_default("sandbox"))
    given = RunOverrides(
        **_members(policy),
        allocation=allocation,
        asks=asks,
        bandit_cost=bandit_cost,
        sandbox=sandbox,
        workers=workers,
        group_size=group_size,
        variants=variants,
        max_evaluations=max_evaluations,
        max_time_s=max_time,
        target=target,
        patience=patience,
        stop_when_solved=stop_when_solved,
        seed=seed,
        edit_format=edit_format,
        temperature=temperature,
        stall_groups=stall_groups,
        max_new_tokens=max_new_tokens,
        fit_tokens_to_code=fit_tokens_to_code,
        train_every=train_every,
        train_method=train_method,
        learning_rate=learning_rate,
        skip_zero_advantage=skip_zero_advantage,
        lazy_penalty=lazy_penalty,
        reward_normalisation=reward_normalisation,
        adapters_dir=str(adapters_dir.absolute()) if adapters_dir is not None else None,
        trainer_model=trainer_model if trainer_model is None else _anchored_model(trainer_model),
        max_failures=max_failures,
        allow_weak_sandbox=allow_weak_sandbox,
    )
    start_search(problem, given, db, None)


def _anchored_model(trainer_model: str) -> str:
    """A local copy of the served model as an absolute path (stored with the run); a hub id as given."""
    return anchored_spec(f"transformers:{trainer_model}").partition(":")[2]


def _anchored(member: MemberSpec) -> MemberSpec:
    """The member with its spec's local path made absolute, and its default name made from that spec."""
    named = member.name != member.default_name()
    return replace(member, spec=anchored_spec(member.spec), name=member.name if named else "")


def _members(policy: list[str] | None) -> dict[str, object]:
    """`--policy` given once or more: the members, and the first one's spec as the run's `policy`."""
    if not policy:
        return {}
    try:  # stored with the run: a relative path must still name the same file when resumed from elsewhere
        return as_options([_anchored(parse_member(text)) for text in policy])
    except MemberError as exc:
        fail(f"--policy: {exc}")


def check_given(given: RunOverrides) -> None:
    if given.edit_format not in (None, *EDIT_FORMATS):
        fail(f"--edit-format {given.edit_format}: use {one_of(EDIT_FORMATS)}")
    if given.train_method not in (None, *TRAIN_METHODS):
        fail(f"--train-method {given.train_method}: use {one_of(TRAIN_METHODS)}")
    if given.allocation not in (None, *ALLOCATIONS):
        fail(f"--allocation {given.allocation}: use {one_of(ALLOCATIONS)}")
    if given.bandit_cost not in (None, *COST_UNIT):
        fail(f"--bandit-cost {given.bandit_cost}: use {one_of(tuple(COST_UNIT))}")
    check_shaping(given.lazy_penalty, given.reward_normalisation)


def start_search(problem: Problem, given: RunOverrides, db: str | None, run_id: int | None) -> None:
    """Build (or resume) the search, run it with the live view, report; exit 1 when it stopped on a failure."""
    check_given(given)
    period_s = line_period_s()  # a bad setting ends the command before the model loads
    try:
        search = build_search(problem, given, db=db, run_id=run_id)
    except SearchSetupError as exc:
        fail(str(exc))
    _announce(search, problem)
    reason = _run_with_live_view(search, period_s)
    _report(search, reason, problem)
    if search.loop.control.systemic:
        raise typer.Exit(1)


def resume(
    db: Annotated[str, typer.Argument(help="archive path or SQLAlchemy URL")],
    run_id: Annotated[int | None, typer.Option("--run", help="run id (default: the latest)")] = None,
    max_evaluations: Annotated[int | None, typer.Option(min=1, help="extend the evaluation budget")] = None,
    max_time: Annotated[float | None, typer.Option(help="extend the time budget (seconds, summed)")] = None,
    target: Annotated[float | None, typer.Option()] = None,
    patience: Annotated[int | None, typer.Option(min=1)] = None,
    stall_groups: Annotated[int | None, typer.Option(min=1, help="groups without a new child that end it")] = None,
    workers: Annotated[int | None, typer.Option(min=1)] = None,
    policy: Annotated[list[str] | None, typer.Option(help=POLICY_HELP)] = None,
) -> None:
    """Resume a run from the archive alone: its problem folder and every option are stored with it."""
    archive = open_archive(db)
    chosen = pick_run(archive, run_id)
    archive.close()
    folder = Path(chosen.config.get("problem_path") or chosen.problem_dir)
    if not folder.is_dir():
        fail(f"run {chosen.id}: its problem folder {folder} is gone; run `evolve run FOLDER --db {db}` instead")
    problem = load_or_fail(folder, str(chosen.config.get("options", {}).get("sandbox", option_default("sandbox"))))
    given = RunOverrides(
        max_evaluations=max_evaluations,
        max_time_s=max_time,
        target=target,
        patience=patience,
        stall_groups=stall_groups,
        workers=workers,
        **_members(policy),
    )
    start_search(problem, given, db, chosen.id)


def register(app: typer.Typer) -> None:
    app.command()(run)
    app.command()(resume)
