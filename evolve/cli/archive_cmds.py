"""`evolve inspect/best/show/export`: read an archive, also while a run is writing to it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from evolve.archive import Archive, ArchiveError, RunRecord
from evolve.cli.common import DbArg, console, duration_text, fail, plain, printable, row_id, vector_table
from evolve.cli.report_cmds import markdown_report, serve, write_html
from evolve.filetree import TreeError, program_diff
from evolve.fitness import score_text, signs
from evolve.problem.outcome import swallowed_lines
from evolve.report.aggregate import run_components
from evolve.report.export import ProgramLayout, evaluation_lines
from evolve.report.outdir import OutputError, OutputFolder, write_file
from evolve.report.queries import export_rows, several_files
from evolve.runs import unreadable_config
from evolve.yields import worst_values

RunOpt = Annotated[int | None, typer.Option("--run", callback=row_id, help="run id (default: the latest)")]


def open_archive(db: str) -> Archive:
    try:
        return Archive(db, create=False)
    except ArchiveError as exc:
        fail(str(exc))


def pick_run(archive: Archive, run_id: int | None) -> RunRecord:
    """`--run`, or the latest run; a clear line and exit 1 when there is no such run."""
    try:
        run = archive.find_run(run_id)
    except ArchiveError as exc:
        fail(str(exc))
    if run is None:
        fail(f"{archive.url}: the archive holds no run yet")
    return readable_run(archive, run)


def readable_run(archive: Archive, run: RunRecord) -> RunRecord:
    """`run`, when the commands can read its stored config (evolve.runs.unreadable_config); one line otherwise,
    rather than a traceback from the first command to read it."""
    said = unreadable_config(archive.url, run)
    if said is not None:
        fail(said)
    return run


def run_signs(run: RunRecord) -> dict[str, float]:
    """Which way is better for each component of a stored run, as the archive's summaries take it."""
    return signs(run_components(run))


def run_worst(run: RunRecord) -> dict[str, float]:
    """Each component's worst value for a stored run, which a `zero` child scores on all (evolve.yields)."""
    return worst_values(run_components(run))


def quality_line(y: dict) -> str:
    """What the children brought (a summary's `yields`), the headline first, as `inspect` and the report say it."""
    return (
        f"children that beat their parent {y['beats_parent']} of {y['children_evaluated']} evaluated: "
        f"{y['beats_parent_per_completion']:.2f} per completion, {y['beats_parent_per_1k_tokens']:.2f} per 1k "
        f"tokens; better on a component {y['improves_component']}, new bests {y['new_best']}; zero (worst value on "
        f"every component, not valid) {y['zero']} ({y['zero_share']:.0%}); same behaviour as the parent {y['same']}"
    )


def arm_line(r: dict) -> str:
    """One member's or ask arm's record (evolve.archive.arms) as `inspect` and the Markdown report print it."""
    rate = r["valid_per_1k_tokens"]
    best = (
        f", best child {score_text(r['best_scalar'])} (program {r['best_id']})" if r["best_scalar"] is not None else ""
    )
    return (
        f"{r['kind']} {r['name']}: {r['groups']} groups ({r['share']:.0%} of all, {r['recent_share']:.0%} of the "
        f"last 20), {r['tokens']} tokens, {r['valid']} new valid"
        f"{f' ({rate:.2f}/1k tokens)' if rate is not None else ''}, {r['improved']} improved, "
        f"{r.get('zero', 0)} scored nothing, {r['copies']} copies{best}"
    )


def inspect(db: DbArg, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Per run: counts, errors by kind, yield, per ensemble member and ask arm its groups and what they brought,
    best per component and scalar, islands, policy versions."""
    archive = open_archive(db)
    runs = [readable_run(archive, run) for run in archive.runs()]
    summaries = [archive.summarize(run, run_signs(run), run_worst(run)) for run in runs]
    if as_json:
        print(json.dumps([asdict(s) for s in summaries], default=str))
        return
    for s in summaries:
        console.print(
            f"[bold]run {s.run_id}[/] {plain(s.problem, lines=False)} ({plain(s.status, lines=False)}, "
            f"{s.elapsed_s:.0f}s): {s.programs} programs, "
            f"{s.evaluations} evaluations, {s.groups} groups, {s.completions} completions"
        )
        console.print(plain(f"  variants {s.variants}; evaluation errors {s.errors}; islands {s.islands}", lines=False))
        if s.stop_reason:
            console.print(f"  last stop: {printable(s.stop_reason, lines=False)}", highlight=False, markup=False)
        if s.interruptions:
            console.print(f"  interrupted (killed) {s.interruptions} time(s), resumed each time")
        if s.incidents:
            counts = printable(f"  incidents (cost one group or child each): {s.incidents}", lines=False)
            console.print(counts, highlight=False, markup=False)
            console.print(f"  last incident: {printable(s.last_incident, lines=False)}", highlight=False, markup=False)
        for o in s.overrides:
            changes = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in o["changes"].items())
            console.print(printable(f"  resumed {o['at']} with {changes}", lines=False), highlight=False, markup=False)
        t, y = s.telemetry, s.yields
        if t.get("tokens"):
            console.print(f"  {t['tokens']} tokens ({t['tokens_per_s'] or 0:.1f}/s while sampling)", highlight=False)
        if t.get("build_s_mean") is not None:
            console.print(f"  builds {t['builds']}: mean {t['build_s_mean']:.3f} s each", highlight=False)
        console.print(f"  {quality_line(y)}", highlight=False)
        console.print(
            f"  yield {y['new_valid']} new valid children: {y['per_completion']:.2f} per completion, "
            f"{y['per_1k_tokens']:.2f} per 1k tokens; variants unchanged {y['unchanged']:.0%}, "
            f"duplicate {y['duplicate']:.0%}, unparseable {y['unparseable']:.0%}; "
            f"completions cut at the token budget {y['cut']} ({y['cut_share']:.0%})",
            highlight=False,
        )
        for row in [*s.members, *s.asks]:
            console.print(f"  {printable(arm_line(row), lines=False)}", highlight=False, markup=False)
        for change in s.adaptations:
            console.print(
                printable(f"  adapted at group {change['group']}: {change['change']} ({change['why']})", lines=False),
                highlight=False,
                markup=False,
            )
        if s.best_scalar:
            console.print(f"  best scalar {score_text(s.best_scalar[1])} (program {s.best_scalar[0]})")
        table = Table("component", "best", "program", show_edge=False)
        for name, (pid, value) in s.best_components.items():
            table.add_row(plain(name, lines=False), score_text(value), str(pid))
        console.print(table)
        for v in s.policy_versions:
            who = f" member {v['member']}" if v.get("member") else ""
            line = f"  policy v{v['number']} (#{v['id']}){who}: {v['base_model']} adapter={v['adapter']}"
            console.print(printable(line, lines=False), highlight=False, markup=False)


def best(
    db: DbArg,
    component: Annotated[str | None, typer.Option(help="best on this component")] = None,
    run: RunOpt = None,
    out: Annotated[Path | None, typer.Option(help="write the program's file(s) into this folder")] = None,
) -> None:
    """Print the code of the best program (by scalar view, or by one component), or write it with --out."""
    archive = open_archive(db)
    chosen = pick_run(archive, run)
    program = archive.best_program(chosen, component, sign=run_signs(chosen).get(component or "", 1.0))
    if program is None:
        fail(f"{db}: no successful program{' with component ' + component if component else ''} yet")
    if out is None:  # the exact code, for a file; on a terminal, without its control characters
        code = printable(program.code) if sys.stdout.isatty() else program.code
        print(code, end="" if code.endswith("\n") else "\n")
        return
    files = _laid_out(out, program.id, partial(_run_layout(chosen).files, program.code))
    _write_files(out, files)
    said = f"wrote program {program.id} to {out} ({len(files)} file{'s' if len(files) > 1 else ''})"
    console.print(printable(said, lines=False), highlight=False, markup=False)  # a folder named [/]x is text


def _number_text(value: object) -> str:
    """A stored metric: a number in 6 significant digits, anything else (a short string) as it is."""
    return score_text(value) if isinstance(value, int | float) else str(value)


def show(db: DbArg, program_id: Annotated[int, typer.Argument(callback=row_id)]) -> None:
    """A program's code, diff against its parent, score vector and lineage."""
    archive = open_archive(db)
    program = archive.program(program_id)
    if program is None:
        fail(f"{db}: no program {program_id}")
    ev = program.evaluation
    console.print(
        f"[bold]program {program.id}[/] run {program.run_id}, island {program.island}, "
        f"generation {program.generation}, parent {program.parent_id}"
    )
    print(printable(program.code))  # a human view (`evolve best` prints the exact code, for files)
    if program.parent_id and (parent := archive.program(program.parent_id)):
        several = several_files(archive, program.run_id)  # the run's layout, never the text, says so
        diff = program_diff(parent.code, program.code, f"program {parent.id}", f"program {program.id}", several)
        print(printable("\n".join(diff)))
    if ev is not None:
        console.print(vector_table(ev.scores))
        console.print(
            f"scalar {score_text(ev.scalar)}; error {plain(ev.error_kind or 'none')} {plain(ev.error or '')}; "
            f"{duration_text(ev.duration_s, ev.build_s)} in {plain(ev.sandbox, lines=False)}",
            highlight=False,
        )
        if ev.feedback:
            console.print(f"feedback: {printable(ev.feedback[:2000])}", highlight=False, markup=False)
        for case, error in list((ev.case_errors or {}).items())[:20]:
            console.print(printable(f"case {case} failed: {error[:300]}"), highlight=False, markup=False)
        for line in swallowed_lines(ev.swallowed):  # what its code raised while it was evaluated
            console.print(printable(f"raised into the evaluator: {line}"), highlight=False, markup=False)
        for call in ev.first_calls or ():  # the seed's: what a prompt naming the interface shows as an example
            console.print(printable(f"first call: {call}"), highlight=False, markup=False)
        if ev.stderr and ev.stderr.strip():
            console.print(f"stderr (tail): {printable(ev.stderr.strip()[-1500:])}", highlight=False, markup=False)
        for stage in ev.stages or []:  # names and values as the candidate's own reply gave them (simple form)
            metrics = ", ".join(f"{k} {_number_text(v)}" for k, v in stage.get("metrics", {}).items())
            console.print(printable(f"stage {stage.get('stage')}: {metrics}"), highlight=False, markup=False)
    chain = archive.lineage(program.id)
    console.print(
        "lineage: "
        + " <- ".join(f"{node.id}({node.scalar:.4g})" if node.scalar is not None else str(node.id) for node in chain)
    )


def _run_layout(run: RunRecord) -> ProgramLayout:
    """How the run's programs are laid out as files, from its stored problem config (evolve/report/export.py)."""
    try:
        return ProgramLayout.of_run(run.config)
    except TreeError as exc:
        fail(f"run {run.id}: {exc}")


def _laid_out(out: Path, program_id: int, lay_out: Callable[[], list[tuple[str, str]]]) -> list[tuple[str, str]]:
    """`lay_out()`: a program's (path, text) as its problem lays them out, or one line (exit 2) naming what its
    problem does not allow. Worked out before anything is written, so that a refusal writes nothing."""
    try:
        return lay_out()
    except TreeError as exc:
        fail(f"{out}: program {program_id} cannot be written out ({exc}); nothing was written")


def _write_files(out: Path, files: Iterable[tuple[str, str | Iterable[str]]]) -> None:
    """Write (path, text) pairs under `out` the one safe way (evolve/report/outdir.py: no link followed, no file
    overwritten that the engine did not write); one line and exit 2 when it refuses."""
    try:
        with OutputFolder(out) as folder:
            for path, text in files:
                folder.write(path, text)
    except OutputError as exc:
        fail(str(exc))


def export(
    db: DbArg, out: Path, top: Annotated[int, typer.Option(help="how many best programs")] = 5, run: RunOpt = None
) -> None:
    """Write the best programs as files and a CSV of every evaluation: vector, times, policy version, parse status.
    Each program is laid out as its problem says (one file, or a folder holding its files), and written as
    `best --out` writes (evolve/report/outdir.py)."""
    if top < 0:
        fail(f"--top {top}: give how many best programs to write, 0 or more")
    archive = open_archive(db)
    chosen = pick_run(archive, run)
    rows = archive.evaluation_rows(chosen)
    ok = sorted((r for r in rows if r[1].error_kind is None), key=lambda r: -(r[1].scalar or 0))[:top]
    layout = _run_layout(chosen)
    files: list[tuple[str, str | Iterable[str]]] = []
    for rank, (program, _ev) in enumerate(ok, 1):
        stem = f"best_{rank:02d}_program_{program.id}"
        files += _laid_out(out, program.id, partial(layout.exported, stem, program.code))
    _write_files(out, [("evaluations.csv", evaluation_lines(export_rows(archive, chosen.id))), *files])
    said = f"wrote {len(rows)} evaluations and {len(ok)} programs to {out}"
    console.print(printable(said, lines=False), highlight=False, markup=False)


def report(
    db: DbArg,
    out: Annotated[Path | None, typer.Option(help="write here instead of stdout")] = None,
    run: RunOpt = None,
    html: Annotated[Path | None, typer.Option("--html", help="write a self-contained HTML report here")] = None,
) -> None:
    """A Markdown report of a run (or, with --html, the interactive HTML report)."""
    if html is not None:
        write_html(db, run, html)
        return
    archive = open_archive(db)
    text = markdown_report(archive, pick_run(archive, run))
    if out is None:
        print(text, end="")
    else:
        try:
            write_file(out, text)  # no link followed, no file overwritten that evolve did not write
        except OutputError as exc:
            fail(f"cannot write the report: {exc}")
        console.print(f"wrote {printable(out, lines=False)}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.command()(inspect)
    app.command()(best)
    app.command()(show)
    app.command()(export)
    app.command()(report)
    app.command()(serve)
