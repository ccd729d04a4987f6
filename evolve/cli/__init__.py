"""The `evolve` command line."""

from __future__ import annotations

import typer

from evolve.cli import problem_cmds

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="LLM-driven evolutionary program search with vector fitness.",
)
problem_cmds.register(app)


def main() -> None:
    app()
