"""What every command shares: one-line errors with exit code 2, how stored or given text reaches the terminal
and a Markdown report (inert: no markup, no escape sequence acts), and how a score vector and a duration are
printed."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, NoReturn

import typer
from rich.console import Console, ConsoleOptions, RenderableType
from rich.markup import escape
from rich.segment import Segment
from rich.table import Table

from evolve.fitness import score_text

# emoji=False: a name such as `:warning:` is text, not a picture.
console = Console(soft_wrap=True, emoji=False)
err_console = Console(stderr=True, emoji=False)

# Plain text, never a Path: a Path collapses the `//` of `sqlite:////abs.db` or `postgresql+psycopg://host/db`.
DbArg = Annotated[str, typer.Argument(metavar="DB", help="archive file path or SQLAlchemy URL")]


def default_note(value: object) -> str:
    """How a help text states a default it cannot show itself (the option's own default is None, "not given"):
    escaped, since rich would otherwise take `[default: ...]` for markup and drop it from the help."""
    return rf"\[default: {value}]"


def one_of(choices: Sequence[str]) -> str:
    """`a, b or c`: the choices an error message offers."""
    return f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else "".join(choices)


# What a terminal acts on rather than shows: C0 and C1 controls (ESC starts every escape sequence; C1's CSI
# 0x9b starts one on its own), DEL, and the Unicode marks that reorder or break lines (a bidi override makes
# `x = 1 # )x` show as other code). Newline and tab are separate: a program's text keeps them, a name does not.
_ACTS = r"\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029"
_CONTROL = re.compile(f"[{_ACTS}]")
_CONTROL_OR_BREAK = re.compile(f"[{_ACTS}\n\t]")


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group())
    return {10: "\\n", 9: "\\t"}.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: object, *, lines: bool = True) -> str:
    """Stored or given text (a candidate's error, a member's name, a path) as a terminal may show it: every
    character it would act on shown as a visible escape (ESC as the four characters `\\x1b`), so a comment cannot
    clear the screen or draw a fake result line. `lines=False` escapes newline and tab too: for a name or a
    one-line field, which must not start a line of its own."""
    return (_CONTROL if lines else _CONTROL_OR_BREAK).sub(_visible, str(text))


def plain(text: object, *, lines: bool = True) -> str:
    """`printable`, with rich markup escaped too: for text inside a line that uses markup of its own (an
    unmatched `[/]` in a name would otherwise end the command with a MarkupError)."""
    return escape(printable(text, lines=lines))


class Inert:
    """A renderable made elsewhere from stored text (the live view's tables hold member names as given), drawn
    with each of its text segments passed through `printable`; rich's own cursor and style codes are kept."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        for segment in console.render(self.renderable, options):
            yield segment if segment.control else Segment(printable(segment.text), segment.style)


_MARKDOWN_SIGNS = re.compile(r"([\\`*_\[\]<>|#])")


def markdown_text(text: object) -> str:
    """Stored text inside a line of a Markdown report (a name in a table cell, a heading, a list item): on one
    line, with the characters that would start emphasis, a link, HTML, code or a table cell backslash-escaped."""
    return _MARKDOWN_SIGNS.sub(r"\\\1", printable(text, lines=False))


def markdown_code(code: str, info: str = "") -> list[str]:
    """A program's text as a fenced block of a Markdown report: the fence is longer than any backtick run inside
    the code, so no line of it closes the block early; its controls are escaped, newline and tab kept; `info`
    (the language) keeps only the characters a language name has."""
    longest = max((len(run) for run in re.findall(r"`+", code)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + re.sub(r"[^A-Za-z0-9_+.\-]", "", info), printable(code.rstrip()), fence]


ROW_ID_MAX = 2**63 - 1  # SQL's largest integer: no row of an archive has a larger id


def row_id(param: typer.CallbackParam, value: int | None) -> int | None:
    """The bound of an id argument or `--run`: a number no row can have ends the command in one line here, where
    the database driver, given it, would raise (it cannot bind an integer past 64 bits) instead of finding none."""
    if value is not None and not 1 <= value <= ROW_ID_MAX:
        name = param.opts[0] if param.param_type_name == "option" else (param.metavar or str(param.name).upper())
        fail(f"{name} {value}: no such id; ids are whole numbers from 1 to {ROW_ID_MAX}")
    return value


def shell_arg(path: object) -> str:
    """A path as one word of a command the user may paste into a shell: a folder with a space stays one."""
    return shlex.quote(str(path))


def fail(message: str, code: int = 2) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {plain(message, lines=False)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def vector_table(scores: Mapping[str, float], title: str = "score vector") -> Table:
    table = Table(title=title, show_edge=False)
    table.add_column("component")
    table.add_column("value", justify="right")
    for name, value in scores.items():
        table.add_row(plain(name, lines=False), score_text(value))
    return table


def duration_text(duration_s: float, build_s: float | None) -> str:
    """An evaluation's duration, with its build's share for a program of another language (None: Python)."""
    build = "" if build_s is None else f" (build {build_s * 1000:.0f} ms of it)"
    return f"{duration_s * 1000:.0f} ms{build}"
