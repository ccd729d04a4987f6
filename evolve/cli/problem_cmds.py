"""`evolve init`, `evolve check`, `evolve eval`: work on one problem folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from evolve.cli.common import console, fail, vector_table
from evolve.fitness import scalar_view
from evolve.problem import Problem, ProblemError, load_problem
from evolve.problem.scaffold import scaffold
from sandboxes.base import EvalOutcome
from sandboxes.factory import SandboxUnavailable, make_sandbox

SandboxOpt = Annotated[str, typer.Option("--sandbox", help="auto | docker | process | ray | ray:ADDRESS")]


def load_or_fail(folder: Path) -> Problem:
    try:
        return load_problem(folder)
    except ProblemError as exc:
        fail(str(exc))


def score_once(problem: Problem, code: str, sandbox_kind: str) -> tuple[EvalOutcome, str]:
    try:
        sandbox = make_sandbox(sandbox_kind, workers=1)
    except SandboxUnavailable as exc:
        fail(str(exc))
    try:
        return sandbox.evaluate(problem, code), sandbox.isolation()
    finally:
        sandbox.close()


def init(folder: Annotated[Path, typer.Argument(help="new problem folder")]) -> None:
    """Scaffold a working split-form problem folder."""
    try:
        files = scaffold(folder)
    except FileExistsError as exc:
        fail(str(exc))
    console.print(f"created {', '.join(str(f) for f in files)}; next: evolve check {folder}")


def check(folder: Path, sandbox: SandboxOpt = "auto") -> None:
    """Validate a problem folder and score its seed program."""
    problem = load_or_fail(folder)
    outcome, isolation = score_once(problem, problem.seed_code, sandbox)
    if outcome.error_kind is not None:
        fail(
            f"{problem.root / problem.config.program.file}: the seed scored {outcome.error_kind}: "
            f"{outcome.error}; fix the seed or {problem.evaluator_path.name}"
        )
    console.print(
        f"[green]ok[/] {problem.name}: {problem.form}-form evaluator, {len(problem.components)} components; {isolation}"
    )
    console.print(vector_table(outcome.scores, title="seed score vector"))
    console.print(
        f"scalar view {scalar_view(problem.components, outcome.scores):.6g}, {outcome.duration_s * 1000:.0f} ms"
    )


def eval_program(
    folder: Path,
    program: Path,
    sandbox: SandboxOpt = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> None:
    """Score one program file for a problem."""
    problem = load_or_fail(folder)
    if not program.is_file():
        fail(f"{program}: no such program file; pass a path to a {problem.config.program.language} file")
    outcome, isolation = score_once(problem, program.read_text(), sandbox)
    scalar = scalar_view(problem.components, outcome.scores)
    if as_json:
        print(
            json.dumps(
                {
                    "scores": outcome.scores,
                    "scalar": scalar,
                    "error_kind": outcome.error_kind,
                    "error": outcome.error,
                    "duration_s": outcome.duration_s,
                    "sandbox": outcome.sandbox,
                    "isolation": isolation,
                    "feedback": outcome.feedback,
                    "case_errors": outcome.case_errors,
                }
            )
        )
        return
    console.print(vector_table(outcome.scores))
    status = "[green]ok[/]" if outcome.ok else f"[red]{outcome.error_kind}[/]: {outcome.error}"
    console.print(f"scalar view {scalar:.6g}; {status}; {outcome.duration_s * 1000:.0f} ms")
    if outcome.feedback:
        console.print(f"feedback: {outcome.feedback}", highlight=False)
    console.print(f"isolation: {isolation}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command()(init)
    app.command()(check)
    app.command("eval")(eval_program)
