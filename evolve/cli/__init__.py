"""The `evolve` command line."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import Any

import typer
import typer.rich_utils

from evolve.archive import ArchiveError
from evolve.cli import archive_cmds, problem_cmds, run_cmd, sandbox_cmds, train_cmd
from evolve.cli.common import fail

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="LLM-driven evolutionary program search with vector fitness.",
)
for module in (problem_cmds, run_cmd, archive_cmds, train_cmd, sandbox_cmds):
    module.register(app)


def one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command`, with an `ArchiveError` raised anywhere in it (a damaged archive found by its third read, not only
    by opening it) ended as every bad input is: its one line and exit code 2, never a traceback."""

    @functools.wraps(command)
    def checked(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except ArchiveError as exc:
            fail(str(exc))

    return checked


for info in app.registered_commands:
    if info.callback is not None:
        info.callback = one_line_errors(info.callback)


# The width of help written to a pipe or a file: rich's default there, 80 columns, cut 16 of `evolve run --help`'s
# option names and values short with "…"; at 140 none is.
PIPED_HELP_WIDTH = 140


def main() -> None:
    if not sys.stdout.isatty() and not (os.environ.get("TERMINAL_WIDTH") or os.environ.get("COLUMNS")):
        typer.rich_utils.MAX_WIDTH = PIPED_HELP_WIDTH
    app()
