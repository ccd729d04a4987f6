"""Opening an archive: the URL, the engine, the schema brought to head, and short transactions on it.

Each write is its own short transaction (a program is committed together with its evaluation, never half),
so a run killed at any instant leaves a consistent archive, and readers in other processes see committed
rows at once (SQLite in WAL mode; any other SQLAlchemy URL works the same way). Every store of the archive
shares one `Database`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import DatabaseError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import NullPool

from evolve.archive.lock_waits import LockWaits
from evolve.archive.models import Base, UnreadableValue
from evolve.archive.urls import ArchiveUrlError, archive_url, display_url, in_memory, missing_driver_hint, sqlite_file

MIGRATIONS = Path(__file__).with_name("migrations")
MIGRATION_LOCK = 0x6576_6F6C  # "evol": the PostgreSQL advisory lock key held while migrating
# Every table an archive of any schema version holds (no migration drops or renames one): a database holding
# others is someone else's, and must not get the archive's tables beside its own.
ARCHIVE_TABLES = frozenset({*Base.metadata.tables, "alembic_version"})
SQLITE_CORRUPT = 11  # the primary result code of "database disk image is malformed"
# Every object of a SQLite file but SQLite's own (sqlite_sequence, sqlite_autoindex_*): a view, an index or a
# trigger is someone's as much as a table is.
SQLITE_OBJECTS = "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite^_%' ESCAPE '^' ORDER BY rowid"
VERSION_TABLE = "alembic_version"
SchemaObject = tuple[str, str]  # (kind, name): ("table", "runs"), ("view", "v"), ("index", ...), ("trigger", ...)


class ArchiveError(Exception):
    """The archive cannot be opened or used; `str()` says what to do."""


# What an archive call raises when the database fails under it (gone, locked past the busy timeout, full):
# named here so that a caller that outlives such a failure (the progress feed) or reports it (the CLI) catches
# it without importing the database library, which only the archive's modules know.
StorageError = SQLAlchemyError


class ArchiveDamaged(ArchiveError, StorageError):
    """The archive's file is damaged (corrupt pages, a stored value that no longer parses): an `ArchiveError` for
    the commands, which say so in one line, and a `StorageError` for the callers that outlive a failed read or
    write (the run stops with that line, the progress feed skips a beat)."""


def damaged(where: str, file: Path | None, reason: str, *, pages: bool = True) -> ArchiveDamaged:
    """The one line a damaged archive is reported with: what is wrong, and how to get the rows back (`pages`:
    SQLite's own pages are damaged, which its `.recover` reads around; a value the engine wrote wrong is not)."""
    if file is None or not pages:
        return ArchiveDamaged(f"the archive {file or where} is damaged ({reason}); restore it from a copy")
    name = shlex.quote(str(file))
    return ArchiveDamaged(
        f"the archive {file} is damaged ({reason}); restore it from a copy, or recover what is left with "
        f"`sqlite3 {name} .recover | sqlite3 recovered.db` and use recovered.db"
    )


def storage_reason(exc: SQLAlchemyError) -> str:
    """A database failure's cause in one line (the driver's own first line, without SQLAlchemy's statement and
    parameters), for a message that says what to fix."""
    cause = getattr(exc, "orig", None) or exc
    lines = str(cause).strip().splitlines()
    return lines[0] if lines else type(cause).__name__


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    for pragma in ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=30000", "synchronous=NORMAL"):
        cur.execute(f"PRAGMA {pragma}")
    cur.close()


def _raise_damaged(url: str, file: Path | None, context: ExceptionContext) -> None:
    """An engine's error hook: a read or write that found corrupt pages (SQLite's SQLITE_CORRUPT, wherever it
    surfaces: a session, a bulk insert, a report's query) raises `ArchiveDamaged` instead of the driver's error.
    Every pooled connection is dropped with it: each holds the pages it read in its cache, damaged ones too, so a
    long-lived reader (`evolve serve`) would go on failing after the file is restored rather than read it anew."""
    cause = context.original_exception
    if getattr(cause, "sqlite_errorcode", 0) & 0xFF == SQLITE_CORRUPT:
        context.is_disconnect = True  # with invalidate_pool_on_disconnect (the default): the whole pool
        raise damaged(url, file, str(cause).strip().splitlines()[0]) from None


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _refuse_foreign(url: str, objects: list[SchemaObject], version: str | None, known: set[str]) -> None:
    """A database is the archive's only if it holds the archive's schema version (an `alembic_version` row naming
    one of its revisions) and no table that no archive has; any other is someone else's, even one holding only a
    view, or tables that happen to carry the archive's names: refused in one line, before the archive adds a table
    to it. An empty database passes (a new archive), as does one holding only an empty `alembic_version` (a first
    migration cut short before it made a table); a version this engine does not know is a newer archive's."""
    foreign = sorted({name for kind, name in objects if kind == "table"} - ARCHIVE_TABLES)
    if foreign:
        raise ArchiveError(
            f"{url}: not an archive: it holds tables of something else ({_listed(foreign)}); give --db a new file "
            "or an archive of evolve's"
        )
    if version is None and any(name != VERSION_TABLE for _kind, name in objects):
        raise ArchiveError(
            f"{url}: not an archive: it holds {_listed([f'{kind} {name}' for kind, name in objects])} but no schema "
            f"version of evolve's (an {VERSION_TABLE} table holding one of its revisions); give --db a new file or "
            "an archive of evolve's"
        )
    if version is not None and version not in known:
        raise ArchiveError(
            f"{url}: archive schema {version} is newer than this vpo-evolve knows; upgrade vpo-evolve "
            "(pip install -U vpo-evolve)"
        )


def _revisions() -> tuple[Config, set[str]]:
    """The migrations' configuration, and every revision an archive of this engine or an older one may hold."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg, {rev.revision for rev in ScriptDirectory.from_config(cfg).walk_revisions()}


def _sqlite_contents(path: Path) -> tuple[list[SchemaObject], str | None] | None:
    """The objects and the schema version of a SQLite file with no WAL beside it, read without writing anything
    (an engine's first connection would switch it to WAL mode; `immutable` makes no -shm either); None where it
    cannot be read so, which the engine's own opening then reports. A file in WAL mode is checked by `_migrate`,
    before any table is made."""
    try:
        con = sqlite3.connect(f"file:{path.as_uri()[len('file://') :]}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error:
        return None
    try:
        objects: list[SchemaObject] = [(kind, name) for kind, name in con.execute(SQLITE_OBJECTS)]
    except sqlite3.Error:
        con.close()
        return None
    try:
        if ("table", VERSION_TABLE) not in objects:
            return objects, None
        row = con.execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchone()
        return objects, (str(row[0]) if row and row[0] else None)
    except sqlite3.Error:  # an alembic_version of another shape: no version of the archive's
        return objects, None
    finally:
        con.close()


def _stored_contents(conn: Connection) -> tuple[list[SchemaObject], str | None]:
    """What `_sqlite_contents` reads, through the engine's connection: any database, a SQLite file in WAL mode."""
    if conn.dialect.name == "sqlite":
        objects: list[SchemaObject] = [(kind, name) for kind, name in conn.execute(text(SQLITE_OBJECTS))]
    else:
        found = inspect(conn)
        objects = [("table", n) for n in found.get_table_names()] + [("view", n) for n in found.get_view_names()]
    if ("table", VERSION_TABLE) not in objects:
        return objects, None
    if "version_num" not in {column["name"] for column in inspect(conn).get_columns(VERSION_TABLE)}:
        return objects, None
    version = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
    return objects, (str(version) if version else None)


def _may_write(path: Path) -> bool:
    """SQLite writes beside the file (its -wal and -shm) as well as in it; a read-only mount says no to both."""
    return os.access(path, os.W_OK) and _may_create_beside(path)


def _may_create_beside(path: Path) -> bool:
    return os.access(path.parent, os.W_OK)


def _beside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _open_read_only(path: Path) -> sqlite3.Connection:
    """A reader's connection to an archive this process may not write (a read-only mount, another user's folder).

    `mode=ro` reads the WAL too, through the -shm file that the writer made or that SQLite makes in a folder it
    may write. Where it can do neither (a read-only folder, and no -wal: no run writes it now), `immutable` reads
    the file, which then holds every committed row, without the -shm. The engine opens a connection per session
    (NullPool), so that a run started after the reader is seen: an immutable connection kept open past a writer
    reads stale pages, or torn ones.
    """
    quoted = path.as_uri()[len("file://") :]  # percent-encoded: a space, `?` or `#` in the path stays the path's
    live = _beside(path, "-wal").exists() or _may_create_beside(path)
    flags = "mode=ro" if live else "mode=ro&immutable=1"
    # timeout: the busy timeout _sqlite_pragmas sets on a writer's connections (30 s), here without a pragma
    return sqlite3.connect(f"file:{quoted}?{flags}", uri=True, timeout=30, check_same_thread=False)


def _check_readable_wal(path: Path) -> None:
    """A -wal without its -shm (a killed run's, copied without it) in a folder SQLite may not write: the rows in
    the WAL cannot be read here, and SQLite would only say "unable to open database file"."""
    wal, shm = _beside(path, "-wal"), _beside(path, "-shm")
    if wal.exists() and not shm.exists() and not _may_create_beside(path):
        raise ArchiveError(
            f"{path}: its {wal.name} is here but not its {shm.name}, and this folder is read-only, so the rows in "
            f"the WAL cannot be read; copy {path.name} and {wal.name} to a folder you may write and open the copy"
        )


def _make_folder(path: Path) -> None:
    """The folder of a new archive file, made if missing; one that cannot be made is a one-line `ArchiveError`."""
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocker = next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)
        why = f"{blocker} is a file, not a folder" if blocker is not None else exc.strerror or type(exc).__name__
        raise ArchiveError(
            f"{path}: cannot make the archive's folder {folder} ({why}); give --db a path in a folder you may write"
        ) from None


def _make_private(path: Path) -> None:
    """A new archive file, made empty (SQLite's own first connection fills it) and readable by its user alone:
    SQLite gives its -wal and -shm the file's own mode, and any user who may open the -shm, even read-only, can
    lock its WAL bytes and stall every writer (issue #57, second round, finding 21); the archive also holds every
    prompt, program and score. 0600 whatever the umask (which only takes bits away); to share an archive, chmod
    it: an existing file's mode is never changed here."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
    except FileExistsError:
        pass
    except OSError as exc:
        raise ArchiveError(
            f"{path}: cannot make the archive file ({exc.strerror}); give --db a path in a folder you may write"
        ) from None


@contextmanager
def _file_lock(path: Path | None) -> Iterator[None]:
    """Serialise schema creation between processes opening one new SQLite file at once.

    pysqlite runs DDL outside any transaction, so two engines could both see an empty file and both create
    tables. The flock is on the file's folder, never on the database file: closing any descriptor of the
    database file would drop the POSIX locks SQLite holds on it through its own connections.
    """
    if path is None:
        yield
        return
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Database:
    """One archive's engine and session factory, its schema at head; `create=False` opens only what exists, and
    opens a SQLite file this process may not write read-only (`read_only`), for the commands that only read."""

    def __init__(self, target: str | Path, *, create: bool = True) -> None:
        try:
            url = archive_url(target)
        except ArchiveUrlError as exc:
            raise ArchiveError(str(exc)) from None
        self.url = display_url(url)  # for messages: never shows a password
        if in_memory(url):
            raise ArchiveError(
                f"--db {target}: an in-memory database is empty to every connection but the one that wrote it, "
                "and gone when the command ends; give a file path (runs/NAME.db) or a server's URL"
            )
        path = sqlite_file(url)
        self.file = path  # the SQLite file, None on a server
        if path is not None and path.is_dir():
            raise ArchiveError(f"{path}: a folder, not an archive file; give a file such as {path / 'runs.db'}")
        if path is not None and not create and not path.exists():
            raise ArchiveError(f"{path}: no archive there; run `evolve run PROBLEM --db {path}` first")
        if path is not None and create:
            _make_folder(path)
            _make_private(path)
        if path is not None and path.exists() and not _beside(path, "-wal").exists():
            contents = _sqlite_contents(path)  # before the engine's first connection sets WAL mode
            if contents is not None:
                _refuse_foreign(self.url, *contents, _revisions()[1])
        self.read_only = path is not None and not create and not _may_write(path)
        if self.read_only and path is not None:
            _check_readable_wal(path)
        try:
            if self.read_only:
                self.engine: Engine = create_engine(url, creator=partial(_open_read_only, path), poolclass=NullPool)
            else:
                self.engine = create_engine(url, pool_pre_ping=path is None)
        except ModuleNotFoundError:
            raise ArchiveError(missing_driver_hint(url)) from None
        if self.engine.dialect.name == "sqlite" and not self.read_only:
            event.listen(self.engine, "connect", _sqlite_pragmas)
        event.listen(self.engine, "handle_error", partial(_raise_damaged, self.url, path))
        try:
            with _file_lock(path if create else None):
                self._migrate(create)
        except ArchiveError:
            self.engine.dispose()
            raise
        except DatabaseError as exc:  # OperationalError among them; "file is not a database" is not one
            self.engine.dispose()
            if path is None:
                check = "the URL and that the server is up"
            elif create:
                check = "that it is an archive file you may write, and its folder"
            else:
                check = "that it is an archive file you may read"
            raise ArchiveError(f"{self.url}: cannot open the archive ({storage_reason(exc)}); check {check}") from None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._waits = LockWaits(self.engine, path) if path is not None and not self.read_only else None

    def _migrate(self, create: bool) -> None:
        cfg, known = _revisions()
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # two engines opening one fresh database migrate one at a time
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
            objects, current = _stored_contents(conn)
            _refuse_foreign(self.url, objects, current, known)
            if current is None and not create:
                raise ArchiveError(f"{self.url}: no archive there; run `evolve run PROBLEM --db URL` first")
            if self.read_only:
                head = ScriptDirectory.from_config(cfg).get_current_head()
                if current != head:
                    raise ArchiveError(
                        f"{self.url}: archive schema {current} is older than this vpo-evolve reads, and this "
                        "process may not write it; open it once where it is writable (evolve inspect) to upgrade it"
                    )
                return
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One short transaction: committed when the block ends, rolled back if it raises. A stored JSON value
        or time that does not parse (a run's config written over by hand) is the archive's damage, said in one line."""
        try:
            with self._sessions.begin() as s:
                yield s
        except json.JSONDecodeError as exc:
            raise damaged(self.url, self.file, f"a stored JSON value does not parse: {exc}", pages=False) from None
        except UnreadableValue as exc:
            raise damaged(self.url, self.file, str(exc), pages=False) from None

    def close(self) -> None:
        if self._waits is not None:
            self._waits.close()
        self.engine.dispose()
