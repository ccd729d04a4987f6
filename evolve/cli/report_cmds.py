"""`evolve report --html` and `evolve serve`: the command-line ends of the report package (its pages and server
know nothing of the command line)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from evolve.cli.common import DbArg, console, fail
from evolve.report.outdir import OutputError, write_file

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def require_report_deps() -> None:
    """plotly and Flask come with the `report` extra; say how to get them instead of a traceback."""
    for module in ("plotly", "flask"):
        try:
            __import__(module)
        except ImportError:
            fail(f"{module} is not installed; install the report extra: pip install 'vpo-evolve[report]'")


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
    console.print(f"wrote {out} ({len(html) / 1e6:.1f} MB, run {run.id}, {time.perf_counter() - started:.1f} s)")


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
        console.print(f"[yellow]serving on {host}: anyone who can reach it can read every program and prompt[/]")
    console.print(
        f"serving run {chosen.id} of {db} at http://{host}:{server.server_port}/ (Ctrl-C stops)", soft_wrap=True
    )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
