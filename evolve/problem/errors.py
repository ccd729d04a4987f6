"""The one error a malformed problem folder raises, and where its messages send the user to read more."""

from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs"


class ProblemError(Exception):
    """A malformed problem folder; `str()` is a single line fit for the terminal."""


def doc(name: str) -> str:
    """A page of the project's docs as a message names it: its absolute path where the checkout the engine runs
    from has it (an editable install), so that it opens from any folder; else its place in the repository (a
    wheel carries no docs)."""
    page = DOCS / name
    return str(page) if page.is_file() else f"docs/{name} in the vpo-evolve repository"
