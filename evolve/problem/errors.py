"""The one error a malformed problem folder raises, and where its messages send the user to read more."""

import reprlib
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[2] / "docs"


_SHOWN = reprlib.Repr()  # keyword arguments only from Python 3.12
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxother = 3, 4, 4, 40, 40


def shown(value: Any) -> str:
    """`value` as an error message shows it: a bounded repr (reprlib), at most about 60 characters, whatever the
    value's size; `f"{value!r:.40}"` builds the whole repr before cutting it (an alias-expanded YAML value, or
    a case of cases() holding megabytes)."""
    return _SHOWN.repr(value)[:60]


class ProblemError(Exception):
    """A malformed problem folder; `str()` is a single line fit for the terminal."""


def doc(name: str) -> str:
    """A page of the project's docs as a message names it: its absolute path where the checkout the engine runs
    from has it (an editable install), so that it opens from any folder; else its place in the repository (a
    wheel carries no docs)."""
    page = DOCS / name
    return str(page) if page.is_file() else f"docs/{name} in the vpo-evolve repository"
