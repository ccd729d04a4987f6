"""The `evolve` command line."""

from __future__ import annotations

import os
import sys

import typer
import typer.rich_utils

from evolve.cli import archive_cmds, problem_cmds, run_cmd, sandbox_cmds, train_cmd

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="LLM-driven evolutionary program search with vector fitness.",
)
for module in (problem_cmds, run_cmd, archive_cmds, train_cmd, sandbox_cmds):
    module.register(app)


# The width of help written to a pipe or a file: rich's default there, 80 columns, cut 16 of `evolve run --help`'s
# option names and values short with "…"; at 140 none is.
PIPED_HELP_WIDTH = 140


def main() -> None:
    if not sys.stdout.isatty() and not (os.environ.get("TERMINAL_WIDTH") or os.environ.get("COLUMNS")):
        typer.rich_utils.MAX_WIDTH = PIPED_HELP_WIDTH
    app()
