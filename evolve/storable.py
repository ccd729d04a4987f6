"""Text made storable: valid UTF-8 whatever produced it.

Why one module at the bottom of the engine: a lone surrogate (what Python makes of bytes it could not decode,
and what a JSON `\\udcff` escape reads back as) cannot be encoded, so SQLite and PostgreSQL refuse its whole row
and an HTTP policy its request. The sandboxes clean what a candidate or an evaluator reported
(sandboxes/scoring.py), and the archive cleans every text it writes, whatever its source
(evolve/archive/models.py): both with this one function. Stdlib only.
"""

from __future__ import annotations


def storable_text(text: str) -> str:
    """`text` as valid UTF-8: each lone surrogate becomes its visible escape (`\\udcff`); the rest is kept."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
