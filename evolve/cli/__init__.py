"""The `evolve` command line."""

from __future__ import annotations

import typer

from evolve.cli import archive_cmds, problem_cmds, run_cmd, sandbox_cmds, train_cmd

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="LLM-driven evolutionary program search with vector fitness.",
)
for module in (problem_cmds, run_cmd, archive_cmds, train_cmd, sandbox_cmds):
    module.register(app)


def main() -> None:
    app()
