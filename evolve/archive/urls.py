"""What `--db` means: a file path or any SQLAlchemy URL, turned into one URL the same way by every command.

The option is read as plain text, never as a `Path`: a `Path` collapses `//`, which turns
`postgresql+psycopg://host/db` or `sqlite:////abs.db` into something else.
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
DRIVER_EXTRAS = {"postgresql": "postgres", "mysql": "mysql"}


class ArchiveUrlError(ValueError):
    """`--db` is neither a path nor a URL SQLAlchemy can read; `str()` says how to write one."""


def archive_url(text: str | Path) -> str:
    """A path becomes `sqlite:///ABSOLUTE_PATH`; a URL is checked and kept (a relative SQLite file made absolute)."""
    s = str(text).strip()
    if not s:
        raise ArchiveUrlError("--db is empty; give a file path (runs/NAME.db) or a URL (postgresql+psycopg://...)")
    try:
        s.encode()
    except UnicodeEncodeError:
        raise ArchiveUrlError(f"--db {s!r}: the name is not valid UTF-8; rename the file or its folder") from None
    if not SCHEME.match(s):
        if "\x00" in s:  # only a caller of the API can give one: no command line holds a NUL byte
            raise ArchiveUrlError(f"--db {s!r}: its file path holds a NUL byte, which no name may hold; remove it")
        # built, not parsed: a `?`, `#` or `%41` in a file name is the name's, not a query or an escape
        return URL.create("sqlite", database=str(Path(s).expanduser().resolve())).render_as_string(hide_password=False)
    scheme, rest = s.split("://", 1)
    s = f"{scheme.lower()}://{rest}"  # SQLITE:// is sqlite://, as URL schemes are read
    try:
        url = make_url(s)
    except (ArgumentError, ValueError) as exc:
        raise ArchiveUrlError(
            f"--db {s}: not a database URL ({exc}); write e.g. sqlite:///runs/x.db or "
            "postgresql+psycopg://user@host/dbname"
        ) from None
    _refuse_nul(url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        # make the file absolute, so that every message, resume hint and adapter folder names the same file
        url = url.set(database=str(Path(url.database).expanduser().resolve()))
    return url.render_as_string(hide_password=False)


def _refuse_nul(url: URL) -> None:
    """A `%00` in a URL decodes to a NUL byte, which no file path, user, host or query of any database may hold: the
    operating system refuses such a path with a bare `ValueError` ("embedded null byte"), and a server's driver
    fails on it each its own way. Said here in one line instead, naming the part that holds it."""
    file = url.get_backend_name() == "sqlite"
    parts = {
        "user name": url.username,
        "password": url.password,
        "host": url.host,
        "file path" if file else "database name": url.database,
        # a key given twice holds a tuple of its values
        "query": "".join(
            key + "".join((value,) if isinstance(value, str) else value) for key, value in url.query.items()
        ),
    }
    for part, value in parts.items():
        if value is not None and "\x00" in str(value):
            raise ArchiveUrlError(
                f"--db {url.render_as_string(hide_password=True)}: its {part} holds a NUL byte (%00), which no name "
                "may hold; write the URL without it"
            )


def sqlite_file(url: str) -> Path | None:
    """The file behind a SQLite URL (None for other databases and in-memory SQLite)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(parsed.database)


def in_memory(url: str) -> bool:
    """A SQLite URL naming no file (`sqlite://`, `sqlite:///:memory:`, `mode=memory`): a database that lives in
    one connection, which no other connection of the run, and no later command, can see."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return False
    return not parsed.database or parsed.database == ":memory:" or parsed.query.get("mode") == "memory"


def display_url(url: str) -> str:
    """The URL with any password masked, for messages and logs."""
    return make_url(url).render_as_string(hide_password=True)


def missing_driver_hint(url: str) -> str:
    backend = make_url(url).get_backend_name()
    extra = DRIVER_EXTRAS.get(backend)
    how = f"pip install 'vpo-evolve[{extra}]'" if extra else "install its SQLAlchemy driver"
    return f"{display_url(url)}: the {backend} driver is not installed; {how}"
