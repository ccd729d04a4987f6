"""What every command shares: one-line errors with exit code 2, and how a score vector and a duration are printed."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from evolve.fitness import score_text

console = Console(soft_wrap=True)
err_console = Console(stderr=True)

# Plain text, never a Path: a Path collapses the `//` of `sqlite:////abs.db` or `postgresql+psycopg://host/db`.
DbArg = Annotated[str, typer.Argument(metavar="DB", help="archive file path or SQLAlchemy URL")]


def default_note(value: object) -> str:
    """How a help text states a default it cannot show itself (the option's own default is None, "not given"):
    escaped, since rich would otherwise take `[default: ...]` for markup and drop it from the help."""
    return rf"\[default: {value}]"


def one_of(choices: Sequence[str]) -> str:
    """`a, b or c`: the choices an error message offers."""
    return f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else "".join(choices)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # all but newline and tab


def printable(text: str) -> str:
    """Text a candidate or a model wrote, as a terminal may show it: its control characters (escape sequences
    that clear the screen, retitle the window or draw a fake result line) become '?'."""
    return _CONTROL.sub("?", text)


def plain(text: str) -> str:
    """`printable`, with rich markup escaped too: for text inside a line that uses markup of its own (an
    unmatched `[/red]` in a candidate's error would otherwise end the command with a MarkupError)."""
    return escape(printable(text))


def shell_arg(path: object) -> str:
    """A path as one word of a command the user may paste into a shell: a folder with a space stays one."""
    return shlex.quote(str(path))


def fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def vector_table(scores: Mapping[str, float], title: str = "score vector") -> Table:
    table = Table(title=title, show_edge=False)
    table.add_column("component")
    table.add_column("value", justify="right")
    for name, value in scores.items():
        table.add_row(name, score_text(value))
    return table


def duration_text(duration_s: float, build_s: float | None) -> str:
    """An evaluation's duration, with its build's share for a program of another language (None: Python)."""
    build = "" if build_s is None else f" (build {build_s * 1000:.0f} ms of it)"
    return f"{duration_s * 1000:.0f} ms{build}"
