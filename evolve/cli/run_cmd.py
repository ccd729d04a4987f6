"""`evolve run`: start or resume a search on a problem folder (the CLI face of `evolve.search.build_search`)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from sqlalchemy.exc import SQLAlchemyError

from evolve.cli.common import console, fail, vector_table
from evolve.cli.problem_cmds import SandboxOpt, load_or_fail
from evolve.fitness import raw_scores
from evolve.loop import SearchLoop
from evolve.problem import Problem
from evolve.runs import RunOptions
from evolve.search import DEFAULT_POLICY, Search, SearchSetupError, build_search
from policies.base import PolicyError, StatusReporting

POLICY_HELP = (
    "transformers:embedded | transformers:DIR_OR_HUB_ID | vllm:URL[,URL2...][@MODEL] | openai:URL@MODEL | "
    "vllm-local:MODEL | replay:FILE"
)
TRAIN_METHODS = ("vpo", "grpo", "multi-rlvr")


def _policy_status(loop: SearchLoop) -> str:
    return loop.policy.status if isinstance(loop.policy, StatusReporting) else ""


def _live(loop: SearchLoop, done: threading.Event) -> None:
    """Redraw the live view twice a second in a terminal; elsewhere, one summary line every 30 s."""
    if console.is_terminal:
        with Live(loop.stats.render(), console=console, refresh_per_second=2) as live:
            while not done.wait(0.5):
                loop.stats.policy_status = _policy_status(loop)
                live.update(loop.stats.render())
    else:
        while not done.wait(30.0):
            status = _policy_status(loop)
            console.print(loop.stats.summary() + (f" [{status}]" if status else ""), highlight=False, markup=False)


def _announce(search: Search, problem: Problem) -> None:
    verb = "resuming" if search.resumed else "starting"
    console.print(f"{verb} run {search.loop.run.id} of {problem.name} in {search.archive.url}", highlight=False)
    console.print(f"isolation: {search.sandbox.isolation()}", highlight=False)
    if search.restored_version is not None:
        console.print(f"serving policy version {search.restored_version} (the run's newest adapter)")
    if search.adapters_dir is not None:
        options = search.loop.options
        console.print(
            f"training: {options.train_method} every {options.train_every} groups; adapters in {search.adapters_dir}"
        )


def _run_with_live_view(search: Search) -> str:
    """Run to the end; on a stop the archive keeps everything committed, and the same command resumes."""
    done = threading.Event()
    viewer = threading.Thread(target=_live, args=(search.loop, done), daemon=True)
    viewer.start()
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
        viewer.join(timeout=2)
        search.close()


def _report(search: Search, reason: str, problem: Problem) -> None:
    loop = search.loop
    console.print(f"[bold]{reason}[/]: {loop.stats.summary()}", highlight=False)
    best = loop.population.best
    if best is not None:
        scores = raw_scores(problem.components, best.oriented)
        console.print(vector_table(scores, title=f"best program {best.id} (scalar {best.scalar:.6g})"))
        console.print(
            f"see it with: evolve best {search.db}    or    evolve show {search.db} {best.id}", highlight=False
        )


def run(
    problem_dir: Annotated[Path, typer.Argument(metavar="PROBLEM")],
    db: Annotated[str | None, typer.Option(help="archive path or SQLAlchemy URL [default: runs/NAME.db]")] = None,
    policy: Annotated[str, typer.Option(help=POLICY_HELP)] = DEFAULT_POLICY,
    sandbox: SandboxOpt = "auto",
    workers: Annotated[int, typer.Option(min=1)] = 2,
    group_size: Annotated[int | None, typer.Option(min=1, help="completions per prompt (G)")] = None,
    variants: Annotated[int | None, typer.Option(min=1, max=8, help="variants per completion (m)")] = None,
    max_evaluations: Annotated[int | None, typer.Option(min=1)] = None,
    max_time: Annotated[float | None, typer.Option(help="seconds, summed over resumes")] = None,
    target: Annotated[float | None, typer.Option(help="stop when the scalar view reaches this")] = None,
    seed: int = 0,
    edit_format: Annotated[str | None, typer.Option(help="diff | full")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(min=16)] = None,
    train_every: Annotated[int, typer.Option(min=0, help="update the policy after every N groups (0: never)")] = 0,
    train_method: Annotated[str, typer.Option(help="vpo | grpo | multi-rlvr")] = "vpo",
    learning_rate: Annotated[float, typer.Option(help="LoRA learning rate")] = 2e-5,
    adapters_dir: Annotated[Path | None, typer.Option(help="[default: next to the archive]")] = None,
    trainer_model: Annotated[
        str | None, typer.Option(help="local dir or hub id of the served base model (for vllm:/openai: policies)")
    ] = None,
    allow_weak_sandbox: Annotated[
        bool, typer.Option(help="run a split-form problem although candidates could read its expected answers")
    ] = False,
) -> None:
    """Run (or resume) an evolutionary search; Ctrl-C stops cleanly and the same command resumes."""
    problem = load_or_fail(problem_dir, sandbox)
    if edit_format not in (None, "diff", "full"):
        fail(f"--edit-format {edit_format}: use diff or full")
    if train_method not in TRAIN_METHODS:
        fail(f"--train-method {train_method}: use vpo, grpo or multi-rlvr")
    options = RunOptions.for_problem(
        problem.config.search,
        workers=workers,
        group_size=group_size,
        variants=variants,
        max_evaluations=max_evaluations,
        max_time_s=max_time,
        target=target,
        seed=seed,
        edit_format=edit_format,
        max_new_tokens=max_new_tokens,
        policy=policy,
        train_every=train_every,
        train_method=train_method,
    )
    try:
        search = build_search(
            problem,
            options,
            db=db,
            sandbox=sandbox,
            learning_rate=learning_rate,
            adapters_dir=adapters_dir,
            trainer_model=trainer_model,
            allow_weak_sandbox=allow_weak_sandbox,
        )
    except SearchSetupError as exc:
        fail(str(exc))
    _announce(search, problem)
    reason = _run_with_live_view(search)
    _report(search, reason, problem)


def register(app: typer.Typer) -> None:
    app.command()(run)
