"""`evolve report` (Markdown, or `--html`) and `evolve serve`: the command-line ends of the report package (its
pages and server know nothing of the command line)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from evolve.archive import Archive, RunRecord
from evolve.cli.common import DbArg, console, fail, markdown_code, markdown_text, plain
from evolve.fitness import score_text
from evolve.problem.outcome import swallowed_lines
from evolve.report.outdir import OutputError, write_file

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def require_report_deps() -> None:
    """plotly and Flask come with the `report` extra; say how to get them instead of a traceback."""
    for module in ("plotly", "flask"):
        try:
            __import__(module)
        except ImportError:
            fail(f"{module} is not installed; install the report extra: pip install 'vpo-evolve[report]'")


def _language(config: dict[str, Any]) -> str:
    """The run's program language from its stored problem config (python for older runs): the code block's tag."""
    return str(((config.get("problem") or {}).get("program") or {}).get("language", "python"))


def markdown_report(archive: Archive, run: RunRecord) -> str:
    """A run's Markdown summary. Every stored text in it (names, statuses, paths, the best program's code) is
    written inert (evolve/cli/common.py): a name cannot open a link or a table cell, the code cannot close its
    block, and no escape sequence reaches a terminal that shows the report."""
    from evolve.cli.archive_cmds import arm_line, quality_line, run_signs, run_worst

    s = archive.summarize(run, run_signs(run), run_worst(run))
    md = markdown_text
    lines = [
        f"# {md(s.problem)}: run {s.run_id} ({md(s.status)})",
        "",
        f"{s.evaluations} evaluations of {s.programs} programs from {s.groups} groups ({s.completions} "
        f"completions) in {s.elapsed_s:.0f} s.",
        "",
        f"- {md(quality_line(s.yields))}",
        f"- variants by parse status: {md(s.variants)}",
        f"- evaluation errors by kind: {md(s.errors or 'none')}",
        f"- programs per island: {md(s.islands)}",
        "",
        "| component | best | program |",
        "|---|---|---|",
    ]
    lines += [f"| {md(name)} | {score_text(value)} | {pid} |" for name, (pid, value) in s.best_components.items()]
    if s.members or s.asks:
        lines += ["", "## Ensemble members and ask arms", ""] + [f"- {md(arm_line(r))}" for r in [*s.members, *s.asks]]
    if s.policy_versions:
        lines += ["", "| policy version | adapter | parent |", "|---|---|---|"]
        lines += [f"| v{v['number']} | {md(v['adapter'] or 'base')} | {v['parent'] or ''} |" for v in s.policy_versions]
    best = archive.best_program(run)
    if best is not None and s.best_scalar:
        chain = " ← ".join(str(p.id) for p in archive.lineage(best.id))
        lines += ["", f"## Best program: {best.id} (scalar {score_text(s.best_scalar[1])})", "", f"Lineage: {chain}"]
        lines += ["", *markdown_code(best.code, _language(run.config))]
        raised = swallowed_lines(best.evaluation.swallowed if best.evaluation else None)
        lines += ["", "Raised into the evaluator:", *(f"- {md(line)}" for line in raised)] if raised else []
    return "\n".join(lines) + "\n"


def write_html(db: Path, run_id: int | None, out: Path) -> None:
    from evolve.cli.archive_cmds import open_archive, pick_run

    require_report_deps()
    from evolve.report.page import write_report

    archive = open_archive(db)
    run = pick_run(archive, run_id)
    started = time.perf_counter()
    html = write_report(archive, run)
    try:
        write_file(out, html)  # no link followed, no file overwritten that evolve did not write
    except OutputError as exc:
        fail(f"cannot write the report: {exc}")
    took = time.perf_counter() - started
    console.print(f"wrote {plain(out, lines=False)} ({len(html) / 1e6:.1f} MB, run {run.id}, {took:.1f} s)")


def serve(
    db: DbArg,
    port: Annotated[int, typer.Option(help="port to listen on (0: any free port)")] = 8000,
    host: Annotated[str, typer.Option(help="address to bind; other than loopback exposes every program")] = "127.0.0.1",
    run: Annotated[int | None, typer.Option("--run", help="run id (default: the latest)")] = None,
) -> None:
    """A live, read-only dashboard of a run that refreshes while the run writes to the archive."""
    from evolve.cli.archive_cmds import open_archive, pick_run

    require_report_deps()
    from evolve.report.server import make_dashboard

    archive = open_archive(db)
    chosen = pick_run(archive, run)
    try:
        server = make_dashboard(archive, chosen.id, host, port)
    except OSError as exc:
        fail(f"{host}:{port}: cannot listen ({exc.strerror}); pick another --port or --host")
    if host not in LOOPBACK:
        shown = plain(host, lines=False)
        console.print(f"[yellow]serving on {shown}: anyone who can reach it can read every program and prompt[/]")
    console.print(
        plain(f"serving run {chosen.id} of {db} at http://{host}:{server.server_port}/ (Ctrl-C stops)", lines=False),
        soft_wrap=True,
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
