"""Text made storable: valid UTF-8 whatever produced it.

Why one module at the bottom of the engine: a lone surrogate (what Python makes of bytes it could not decode,
and what a JSON `\\udcff` escape reads back as) cannot be encoded, so SQLite and PostgreSQL refuse its whole row
and an HTTP policy its request. The sandboxes clean what a candidate or an evaluator reported
(sandboxes/scoring.py), and the archive cleans every text it writes, whatever its source
(evolve/archive/models.py): both with this one function. Stdlib only.

NUL is valid UTF-8 but PostgreSQL refuses it in a text column while SQLite keeps it, so a NUL in a candidate's
stdout, a case error or a swallowed message (stored as JSON, then shown in every prompt built from that program)
stopped a PostgreSQL run (five failed stores in a row) that SQLite finished. It is written as the four characters
`\\x00`, the same visible backslash escape as a
lone surrogate's: a model reading the prompt sees that a NUL was there and where (U+FFFD would claim a byte that
did not decode), and both databases store the same text.
"""

from __future__ import annotations


def storable_text(text: str) -> str:
    """`text` as valid UTF-8 without NUL: each lone surrogate becomes its visible escape (`\\udcff`), each NUL
    `\\x00`; the rest is kept."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text
