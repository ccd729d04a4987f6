"""`evolve run`: start or resume a search on a problem folder (the CLI face of `evolve.search.build_search`)."""

from __future__ import annotations

import inspect
import os
import signal
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.live import Live

from evolve.archive import StorageError, storage_reason
from evolve.cli.archive_cmds import open_archive, pick_run
from evolve.cli.common import Inert, console, default_note, fail, plain, printable, row_id, shell_arg, vector_table
from evolve.cli.option_flags import option_parameters, with_flags
from evolve.cli.problem_cmds import load_or_fail
from evolve.fitness import raw_scores, score_text
from evolve.group_sampler import structured_by
from evolve.loop import SearchLoop
from evolve.members import MemberError, MemberSpec, as_options, parse_member
from evolve.options import DEFAULT_POLICY, RunOverrides, invalid_value, option_default
from evolve.problem import Problem
from evolve.sampling_feed import feed_sampling
from evolve.search import Search, SearchSetupError, build_search
from evolve.stats import LiveLines
from policies.from_spec import anchored_spec
from policies.policy import Describing, PolicyError, ProgressReporting, StatusReporting
from policies.spec import PolicySpec
from sandboxes.sandbox import SandboxRefused

POLICY_HELP = (
    "embedded | llama:embedded | llama:PATH.gguf | transformers:embedded | transformers:DIR_OR_HUB_ID | "
    r"vllm:URL[,URL2...]\[@MODEL] | openai:URL@MODEL | vllm-local:MODEL | replay:FILE; optionally followed by "
    r"\[temperature=T,top_p=P,template=T,edit_format=F,weight=W,name=N]; repeat it for an ensemble"
)
# Without a terminal, the seconds between two progress lines. An environment variable rather than a flag: it
# changes nothing a run records, and lets a test see several lines in a few seconds instead of a minute.
LINE_PERIOD_ENV = "EVOLVE_PROGRESS_EVERY_S"
DEFAULT_LINE_PERIOD_S = 10.0


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
        # Inert: the view's tables hold member names, ask lines and a server's status as given
        with Live(Inert(loop.stats.render()), console=console, refresh_per_second=2) as live:
            while not done.wait(0.5):  # this thread reads the ledger's counters and writes none of them
                sampling, bar = _sampling(loop)
                live.update(Inert(loop.stats.render(LiveLines(_policy_status(loop), sampling, bar))))
    else:
        ticks = 0
        while not done.wait(period_s):
            ticks += 1
            status = _policy_status(loop)
            line, _bar = _sampling(loop)
            if ticks % 3 == 0 or not line:
                line = loop.stats.summary() + (f" [{line}]" if line else "")
            line += f" [{status}]" if status else ""
            console.print(printable(line, lines=False), highlight=False, markup=False)


def _structured_line(search: Search) -> str:
    """Whether answers are held to their shape while sampled (`--structured`), and for which members."""
    mode = search.loop.options.structured
    if mode == "off":
        return "structured sampling: off (--structured off): answers are free text"
    free = [m.name for m in search.loop.members if not structured_by(m.policy)]
    if not free:
        return f"structured sampling: {mode}: every answer is held to its tags and fences while it is sampled"
    said = ", ".join(free)
    return (
        f"structured sampling: {mode}, but {said} cannot (only llama.cpp and transformers policies, and servers that "
        "keep to a grammar, can): their answers are free text"
    )


def _copy_guard_line(search: Search) -> str | None:
    """Whether a whole rewrite that starts to copy a known program is steered off the copy while it is sampled
    (`--copy-guard`), and for which members (the in-process samplers guard; an HTTP server does not); None where
    answers are free text."""
    options = search.loop.options
    if options.structured == "off":
        return None
    if not options.copy_guard:
        return "copy guard: off (--no-copy-guard): a whole rewrite may copy a known program to its end"
    unguarded = [m.name for m in search.loop.members if not hasattr(m.policy, "copy_guard")]
    said = f" ({', '.join(unguarded)} cannot: its copies are caught as duplicates only)" if unguarded else ""
    return (
        "copy guard: on: a whole rewrite that starts to copy a known program is steered off it, at the first point"
        " where the model itself gives other tokens some weight" + said
    )


def _key_lines(search: Search) -> list[str]:
    """A line per member whose server the problem folder named ([[search.policies]]) rather than the user: its
    URL, and whether it is sent the API key (only with --trust-problem-urls), so a folder pointing the run at
    a server of its own is seen at the start."""
    lines = []
    for member in search.loop.options.members():
        urls = PolicySpec.parse(member.spec).urls if member.from_problem else ()
        if urls:
            key = (
                "sent the API key (--trust-problem-urls)"
                if member.env_key
                else "sent no API key (--trust-problem-urls sends it EVOLVE_API_KEY or OPENAI_API_KEY)"
            )
            lines.append(f"member {member.name}: {', '.join(urls)} is named by the problem folder: {key}")
    return lines


def _announce(search: Search, problem: Problem) -> None:
    verb = "resuming" if search.resumed else "starting"
    said = f"{verb} run {search.loop.run.id} of {problem.name} in {search.archive.url}"
    console.print(printable(said, lines=False), highlight=False, markup=False)
    if search.previous_status == "running":
        console.print(
            f"run {search.loop.run.id} was interrupted (its process was killed); resuming where it stopped",
            highlight=False,
        )
    for note in search.notes:
        console.print(printable(note, lines=False), highlight=False, markup=False)
    for name, (old, new) in (search.overrides or {}).items():
        said = f"option {name}: {old!r} -> {new!r} (given on this resume; recorded with the run)"
        console.print(printable(said, lines=False), highlight=False, markup=False)
    console.print(f"isolation: {printable(search.sandbox.isolation(), lines=False)}", highlight=False, markup=False)
    timeout = search.loop.timeout
    if timeout is not None:  # the line of a timeout the seed's time settles comes when the seed is scored
        timeout.announce = lambda line: console.print(printable(line, lines=False), highlight=False, markup=False)
        console.print(printable(timeout.opening_line(), lines=False), highlight=False, markup=False)
    members = search.loop.members
    for member in members:
        policy = member.policy
        how = f" ({policy.description})" if isinstance(policy, Describing) else ""
        who = f"member {member.name}: " if len(members) > 1 else ""
        console.print(printable(f"policy: {who}{policy.name}{how}", lines=False), highlight=False, markup=False)
        if member.untrainable:
            said = f"member {member.name} is not trained: {member.untrainable}"
            console.print(printable(said, lines=False), highlight=False, markup=False)
    for line in _key_lines(search):
        console.print(printable(line, lines=False), highlight=False, markup=False)
    console.print(printable(_structured_line(search), lines=False), highlight=False, markup=False)
    guard_line = _copy_guard_line(search)
    if guard_line:
        console.print(printable(guard_line, lines=False), highlight=False, markup=False)
    if len(members) > 1:
        options = search.loop.options
        said = f"ensemble: {len(members)} members, {options.allocation} allocation by value per {options.bandit_cost}"
        console.print(printable(said, lines=False), highlight=False, markup=False)
    if search.loop.ensemble.changes:
        console.print(printable(search.loop.ensemble.changes, lines=False), highlight=False, markup=False)
    if search.restored_version is not None:
        console.print(f"serving policy version {search.restored_version} (the run's newest adapter)")
    if search.adapters_dir is not None:
        options = search.loop.options
        zero = "skipped" if options.skip_zero_advantage else "kept"
        said = (
            f"training: {options.train_method} every {options.train_every} groups (zero-advantage groups {zero}, "
            f"lazy penalty {options.lazy_penalty:g}, rewards by {options.reward_normalisation}); adapters in "
            f"{search.adapters_dir}"
        )
        console.print(printable(said, lines=False), highlight=False, markup=False)


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
    except (PolicyError, StorageError, SandboxRefused) as exc:  # all committed so far stays; the same command resumes
        done.set()
        said = storage_reason(exc) if isinstance(exc, StorageError) else exc  # the driver's line, not its SQL
        fail(f"the run stopped: {said}; fix that, then run the same command to resume")
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
    console.print(f"[bold]{plain(reason, lines=False)}[/]: {plain(loop.stats.summary(), lines=False)}", highlight=False)
    best = loop.population.best
    if best is not None:
        scores = raw_scores(problem.components, best.oriented)
        console.print(vector_table(scores, title=f"best program {best.id} (scalar {score_text(best.scalar)})"))
        db = shell_arg(search.db)
        console.print(
            printable(f"see it with: evolve best {db}    or    evolve show {db} {best.id}", lines=False),
            highlight=False,
            markup=False,  # a folder named [x] is text, not a style
        )
    if loop.control.interrupted.is_set():
        # A forward pass cut short by Ctrl-C may still run in the policy's daemon thread; everything is committed,
        # so leave now rather than let interpreter shutdown tear torch down under it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _own(command: object) -> list[inspect.Parameter]:
    """The command's own parameters (what it declares itself); the options come as `**flags` (option_flags)."""
    parameters = inspect.signature(command, eval_str=True).parameters.values()  # type: ignore[arg-type]
    return [p for p in parameters if p.kind is not p.VAR_KEYWORD]


def _given(policy: list[str] | None, flags: dict[str, Any]) -> RunOverrides:
    """What the command line gives, as stored: paths made absolute, so that a resume from elsewhere finds them."""
    if flags.get("adapters_dir") is not None:
        flags["adapters_dir"] = str(Path(flags["adapters_dir"]).absolute())
    if flags.get("trainer_model") is not None:
        flags["trainer_model"] = _anchored_model(flags["trainer_model"])
    return RunOverrides(**_members(policy), **flags)


def run(
    problem_dir: Annotated[Path, typer.Argument(metavar="PROBLEM")],
    db: Annotated[
        str | None, typer.Option(help=f"archive path or SQLAlchemy URL {default_note('runs/NAME.db')}")
    ] = None,
    policy: Annotated[list[str] | None, typer.Option(help=f"{POLICY_HELP} {default_note(DEFAULT_POLICY)}")] = None,
    **flags: Any,
) -> None:
    """Run (or resume) an evolutionary search. A resume reuses the options the run was started with; a flag
    given again overrides its stored value (recorded with the run). Ctrl-C stops cleanly."""
    given = _given(policy, flags)
    check_given(given)  # a bad flag ends the command before anything is loaded
    problem = load_or_fail(problem_dir, flags.get("sandbox") or option_default("sandbox"))
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
    said = invalid_value(given.given())
    if said:
        fail(said)


def start_search(problem: Problem, given: RunOverrides, db: str | None, run_id: int | None) -> None:
    """Build (or resume) the search, run it with the live view, report; exit 1 when it stopped on a failure.
    `given` was checked by the command (`check_given`) before anything was loaded."""
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
    run_id: Annotated[int | None, typer.Option("--run", callback=row_id, help="run id (default: the latest)")] = None,
    policy: Annotated[list[str] | None, typer.Option(help=POLICY_HELP)] = None,
    **flags: Any,
) -> None:
    """Resume a run from the archive alone: its problem folder and every option are stored with it."""
    given = _given(policy, flags)
    check_given(given)
    archive = open_archive(db)
    chosen = pick_run(archive, run_id)
    archive.close()
    folder = Path(chosen.config.get("problem_path") or chosen.problem_dir)
    if not folder.is_dir():
        fail(f"run {chosen.id}: its problem folder {folder} is gone; run `evolve run FOLDER --db {db}` instead")
    problem = load_or_fail(folder, str(chosen.config.get("options", {}).get("sandbox", option_default("sandbox"))))
    start_search(problem, given, db, chosen.id)


def register(app: typer.Typer) -> None:
    app.command()(with_flags(run, _own(run), option_parameters("run")))
    app.command()(with_flags(resume, _own(resume), option_parameters("resume")))
