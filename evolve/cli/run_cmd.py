"""`evolve run`: start or resume a search on a problem folder."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from sqlalchemy.exc import SQLAlchemyError

from evolve.archive import Archive, ArchiveError
from evolve.cli.common import console, fail, vector_table
from evolve.cli.problem_cmds import SandboxOpt, load_or_fail
from evolve.loop import SearchLoop, run_search
from evolve.runs import RunMismatch, RunOptions, check_resumable, open_run
from evolve.training import OnlineTrainer, TrainingUnsupported, restore_latest_adapter
from policies.base import PolicyError
from policies.factory import make_policy
from policies.trainer import TrainConfig
from sandboxes.factory import SandboxUnavailable, make_sandbox


def _live(loop: SearchLoop, done: threading.Event) -> None:
    """Redraw the live view twice a second in a terminal; elsewhere, one summary line every 30 s."""
    if console.is_terminal:
        with Live(loop.stats.render(), console=console, refresh_per_second=2) as live:
            while not done.wait(0.5):
                loop.stats.policy_status = getattr(loop.policy, "status", "")
                live.update(loop.stats.render())
    else:
        while not done.wait(30.0):
            status = getattr(loop.policy, "status", "")
            console.print(loop.stats.summary() + (f" [{status}]" if status else ""), highlight=False, markup=False)


def run(
    problem_dir: Annotated[Path, typer.Argument(metavar="PROBLEM")],
    db: Annotated[Path | None, typer.Option(help="archive path or SQLAlchemy URL [default: runs/NAME.db]")] = None,
    policy: Annotated[str, typer.Option(help="transformers:embedded | transformers:DIR_OR_HUB_ID | replay:FILE")] = (
        "transformers:embedded"
    ),
    sandbox: SandboxOpt = "auto",
    workers: Annotated[int, typer.Option(min=1)] = 2,
    group_size: Annotated[int | None, typer.Option(min=1, help="completions per prompt (G)")] = None,
    variants: Annotated[int | None, typer.Option(min=1, max=8, help="variants per completion (m)")] = None,
    max_evaluations: Annotated[int | None, typer.Option(min=1)] = None,
    max_time: Annotated[float | None, typer.Option(help="seconds, summed over resumes")] = None,
    target: Annotated[float | None, typer.Option(help="stop when the scalar view reaches this")] = None,
    seed: int = 0,
    edit_format: Annotated[str | None, typer.Option(help="auto | diff | full [default: the problem's]")] = None,
    stall_groups: Annotated[
        int, typer.Option(min=1, help="stop after this many groups in a row without a new child")
    ] = RunOptions.stall_groups,
    max_new_tokens: Annotated[int | None, typer.Option(min=16)] = None,
    train_every: Annotated[int, typer.Option(min=0, help="update the policy after every N groups (0: never)")] = 0,
    train_method: Annotated[str, typer.Option(help="vpo | grpo | multi-rlvr")] = "vpo",
    learning_rate: Annotated[float, typer.Option(help="LoRA learning rate")] = 2e-5,
    adapters_dir: Annotated[Path | None, typer.Option(help="[default: next to the archive]")] = None,
    trainer_model: Annotated[
        str | None, typer.Option(help="local dir or hub id of the served base model (for vllm:/openai: policies)")
    ] = None,
) -> None:
    """Run (or resume) an evolutionary search; Ctrl-C stops cleanly and the same command resumes."""
    problem = load_or_fail(problem_dir)
    search = problem.config.search
    if edit_format not in (None, "auto", "diff", "full"):
        fail(f"--edit-format {edit_format}: use auto, diff or full")
    options = RunOptions(
        workers=workers,
        group_size=group_size or search.group_size,
        variants=variants or search.variants,
        max_evaluations=max_evaluations or search.max_evaluations,
        max_time_s=max_time,
        target=target,
        seed=seed,
        edit_format=edit_format or search.edit_format,
        temperature=search.temperature,
        max_new_tokens=max_new_tokens or search.max_new_tokens,
        policy=policy,
        train_every=train_every,
        train_method=train_method,
        stall_groups=stall_groups,
    )
    if train_method not in ("vpo", "grpo", "multi-rlvr"):
        fail(f"--train-method {train_method}: use vpo, grpo or multi-rlvr")
    target_db: str | Path = db if db is not None else Path("runs") / f"{problem.name}.db"
    if "://" not in str(target_db):
        Path(target_db).parent.mkdir(parents=True, exist_ok=True)
    try:
        archive = Archive(target_db)
        check_resumable(archive, problem)
        sandbox_impl = make_sandbox(sandbox, workers=workers)
        policy_impl = make_policy(policy)  # slow for local models: after every quick check, before any write
        run_row, resumed = open_run(archive, problem, options)
    except (ArchiveError, RunMismatch, SandboxUnavailable, PolicyError) as exc:
        fail(str(exc))
    console.print(
        f"{'resuming' if resumed else 'starting'} run {run_row.id} of {problem.name} in {archive.url}", highlight=False
    )
    console.print(f"isolation: {sandbox_impl.isolation()}", highlight=False)
    restored = restore_latest_adapter(archive, run_row.id, policy_impl)
    if restored is not None:
        console.print(f"serving policy version {restored} (the run's newest adapter)")
    train_step = None
    if train_every:
        where = adapters_dir or adapters_next_to(target_db, problem.name)
        try:
            trainer = OnlineTrainer(
                archive,
                run_row.id,
                list(problem.components),
                options.variants,
                policy_impl,
                TrainConfig(method=train_method, learning_rate=learning_rate),
                where,
                trainer_model=trainer_model,
            )
        except (TrainingUnsupported, PolicyError) as exc:
            fail(str(exc))
        train_step = trainer.step
        console.print(f"training: {train_method} every {train_every} groups; adapters in {where}")
    loop = SearchLoop(problem, archive, policy_impl, sandbox_impl, run_row, options, train_step)
    done = threading.Event()
    viewer = threading.Thread(target=_live, args=(loop, done), daemon=True)
    viewer.start()
    try:
        reason = run_search(loop)
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
        sandbox_impl.close()
    console.print(f"[bold]{reason}[/]: {loop.stats.summary()}", highlight=False)
    best = loop.population.best
    if best is not None:
        scores = {c.name: c.sign * float(v) for c, v in zip(problem.components, best.oriented, strict=True)}
        console.print(vector_table(scores, title=f"best program {best.id} (scalar {best.scalar:.6g})"))
        console.print(
            f"see it with: evolve best {target_db}    or    evolve show {target_db} {best.id}", highlight=False
        )
    if loop.interrupted.is_set():
        # A forward pass cut short by Ctrl-C may still run in the policy's daemon thread; everything is committed,
        # so leave now rather than let interpreter shutdown tear torch down under it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def adapters_next_to(db: str | Path, name: str) -> Path:
    """`runs/NAME.db` keeps its adapters in `runs/NAME.adapters/`; a database URL in `runs/NAME.adapters/`."""
    return Path(db).with_suffix(".adapters") if "://" not in str(db) else Path("runs") / f"{name}.adapters"


def register(app: typer.Typer) -> None:
    app.command()(run)
