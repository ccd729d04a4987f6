"""`evolve init`, `evolve check`, `evolve eval`: work on one problem folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Annotated

import typer

from evolve.cli.common import console, duration_text, err_console, fail, plain, printable, shell_arg, vector_table
from evolve.filetree import TreeError, join_files
from evolve.fitness import scalar_view, score_text
from evolve.problem import Problem, ProblemError, load_problem
from evolve.problem.openevolve import is_openevolve_folder, load_openevolve, problem_toml
from evolve.problem.outcome import EvalOutcome
from evolve.problem.scaffold import scaffold
from evolve.problem.seed_files import read_text
from evolve.report.outdir import OutputError, write_file
from sandboxes.backends import SandboxUnavailable, make_sandbox, weak_sandbox_refusal
from sandboxes.sandbox import SandboxRefused

SandboxOpt = Annotated[str, typer.Option("--sandbox", help="auto | docker | process | ray | ray:ADDRESS")]
AllowWeakOpt = Annotated[
    bool,
    typer.Option(
        "--allow-weak-sandbox", help="run a split-form problem although candidates could read its expected answers"
    ),
]


def load_or_fail(folder: Path, sandbox_kind: str = "auto") -> Problem:
    """The problem in `folder`; an OpenEvolve folder has its seed scored once in the sandbox to name its metrics."""
    try:
        if not is_openevolve_folder(folder):
            return load_problem(folder)
        problem, notes = load_openevolve(folder, lambda p: score_once(p, p.seed_code, sandbox_kind)[0])
    except ProblemError as exc:
        fail(str(exc))
    for note in notes:
        err_console.print(f"note: {printable(note, lines=False)}", markup=False, highlight=False, soft_wrap=True)
    return problem


def score_once(problem: Problem, code: str, sandbox_kind: str, allow_weak: bool = False) -> tuple[EvalOutcome, str]:
    """Score `code` once, on a sandbox that keeps what it promises (the rule of `evolve run`), or fail."""
    try:
        sandbox = make_sandbox(sandbox_kind, workers=1)
    except (SandboxUnavailable, SandboxRefused) as exc:
        fail(str(exc))
    try:
        refusal = weak_sandbox_refusal(sandbox, problem, allow_weak)
        if refusal is not None:
            fail(refusal)
        return sandbox.evaluate(problem, code), sandbox.isolation()
    except SandboxRefused as exc:
        fail(str(exc))
    finally:
        sandbox.close()


def init(
    folder: Annotated[Path | None, typer.Argument(help="new problem folder")] = None,
    from_dir: Annotated[
        Path | None, typer.Option("--from", help="an OpenEvolve folder: write its inferred problem.toml")
    ] = None,
    sandbox: SandboxOpt = "auto",
    language: Annotated[str, typer.Option("--language", help="the seed's language: python, c or rust")] = "python",
    files: Annotated[bool, typer.Option("--files", help="python: a program of two files (seed.py and helpers.py)")] = (
        False
    ),
) -> None:
    """Scaffold a working split-form problem folder, or write problem.toml for an OpenEvolve folder."""
    if from_dir is not None:
        target = init_from_openevolve(from_dir, folder, sandbox)
        said = f"wrote {target}; edit it, then: evolve check {shell_arg(target.parent)}"
        console.print(printable(said, lines=False), highlight=False, markup=False)
        return
    if folder is None:
        fail("evolve init: give a new folder (evolve init DIR) or an OpenEvolve folder (evolve init --from DIR)")
    try:
        written = scaffold(folder, language, files)
    except (FileExistsError, ValueError) as exc:
        fail(str(exc))
    said = f"created {', '.join(str(f) for f in written)}; next: evolve check {shell_arg(folder)}"
    console.print(printable(said, lines=False), highlight=False, markup=False)


def init_from_openevolve(source: Path, folder: Path | None, sandbox_kind: str) -> Path:
    """Infer the problem of an OpenEvolve folder and write it as problem.toml there (or in a copy at `folder`)."""
    if not is_openevolve_folder(source):
        fail(f"{source}: not an OpenEvolve folder (initial_program.py and evaluator.py, no problem.toml)")
    if folder is not None and folder.resolve() != source.resolve() and folder.exists() and any(folder.iterdir()):
        fail(f"{folder}: not empty; pick a new folder, or leave it out to write problem.toml into {source}")
    problem = load_or_fail(source, sandbox_kind)
    text = problem_toml(problem)
    if folder is not None and folder.resolve() != source.resolve():
        shutil.copytree(source, folder, dirs_exist_ok=True)
        source = folder
    target = source / "problem.toml"
    try:  # a new file only, through no link (evolve/report/outdir.py): one planted meanwhile is refused
        write_file(target, text, record=False)
    except OutputError as exc:
        fail(str(exc))
    return target


def check(folder: Path, sandbox: SandboxOpt = "auto", allow_weak_sandbox: AllowWeakOpt = False) -> None:
    """Validate a problem folder and score its seed program."""
    problem = load_or_fail(folder, sandbox)
    outcome, isolation = score_once(problem, problem.seed_code, sandbox, allow_weak_sandbox)
    if outcome.error_kind is not None:
        fail(
            f"{problem.root / problem.config.program.entry}: the seed scored {outcome.error_kind}: "
            f"{outcome.error}; fix the seed or {problem.evaluator_path.name}"
        )
    console.print(
        f"[green]ok[/] {plain(problem.name, lines=False)}: {problem.form}-form evaluator, "
        f"{len(problem.components)} components; {plain(isolation, lines=False)}"
    )
    console.print(vector_table(outcome.scores, title="seed score vector"))
    console.print(
        f"scalar view {score_text(scalar_view(problem.components, outcome.scores))}, {outcome.duration_s * 1000:.0f} ms"
    )
    if outcome.case_errors:  # some cases failed, not all: their fail values sit in the vector above like scores
        name, error = next(iter(outcome.case_errors.items()))
        seed = shell_arg(problem.root / problem.config.program.entry)
        said = (
            f"warning: {len(outcome.case_errors)} of {len(problem.components)} cases of the seed failed and scored "
            f"their fail value; first: {name}: {error}; `evolve eval {shell_arg(folder)} {seed} --json` lists each"
        )
        console.print(printable(said, lines=False), highlight=False, markup=False)
    if not (problem.root / "problem.toml").is_file():
        said = (
            f"OpenEvolve folder: components inferred from the seed's metrics; `evolve init --from {shell_arg(folder)}`"
            " writes them to problem.toml for editing"
        )
        console.print(printable(said, lines=False), highlight=False, markup=False)


def eval_program(
    folder: Path,
    program: Path,
    sandbox: SandboxOpt = "auto",
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    allow_weak_sandbox: AllowWeakOpt = False,
) -> None:
    """Score one program file for a problem."""
    problem = load_or_fail(folder, sandbox)
    if problem.multi_file:
        code = _program_tree(problem, program)
    elif not program.is_file():
        fail(f"{program}: no such program file; pass a path to a {problem.config.program.language} file")
    else:
        try:
            code = read_text(program)
        except ProblemError as exc:
            fail(str(exc))
    outcome, isolation = score_once(problem, code, sandbox, allow_weak_sandbox)
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
                    "build_s": outcome.build_s,
                    "sandbox": outcome.sandbox,
                    "isolation": isolation,
                    "feedback": outcome.feedback,
                    "case_errors": outcome.case_errors,
                    "stages": outcome.stages,
                }
            )
        )
        return
    console.print(vector_table(outcome.scores))
    status = "[green]ok[/]" if outcome.ok else f"[red]{plain(outcome.error_kind)}[/]: {plain(outcome.error or '')}"
    console.print(f"scalar view {score_text(scalar)}; {status}; {duration_text(outcome.duration_s, outcome.build_s)}")
    if outcome.feedback:
        console.print(f"feedback: {printable(outcome.feedback)}", highlight=False, markup=False)
    console.print(f"isolation: {printable(isolation, lines=False)}", highlight=False, markup=False)


def _program_tree(problem: Problem, folder: Path) -> str:
    """A program of several files read from `folder` (as `evolve best --out` writes it): the problem's files."""
    if not folder.is_dir():
        fail(f"{folder}: not a folder; a program of {len(problem.files)} files is scored from a folder holding them")
    try:
        return join_files([(path, (folder / path).read_text()) for path in problem.files])
    except (OSError, UnicodeDecodeError, TreeError) as exc:
        fail(f"{folder}: cannot read the program's files ({exc}); it must hold {', '.join(problem.files)}")


def register(app: typer.Typer) -> None:
    app.command()(init)
    app.command()(check)
    app.command("eval")(eval_program)
