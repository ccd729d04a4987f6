"""`Archive`: the one repository API the loop, the CLI and the trainer share.

Each write is its own short transaction (a program is committed together with its evaluation, never half),
so a run killed at any instant leaves a consistent archive, and readers in other processes see committed
rows at once (SQLite in WAL mode; any other SQLAlchemy URL works the same way).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, func, inspect, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from evolve.archive.codehash import code_hash
from evolve.archive.inserts import CompletionRecord, GroupTelemetry, write_group
from evolve.archive.models import Completion, Evaluation, Incident, PolicyVersion, Program, Prompt, Run, Variant
from evolve.archive.parents import ParentReads
from evolve.archive.queries import ArchiveQueries
from evolve.archive.records import PendingVariant
from evolve.archive.urls import ArchiveUrlError, archive_url, display_url, missing_driver_hint, sqlite_file

MIGRATIONS = Path(__file__).with_name("migrations")
MIGRATION_LOCK = 0x6576_6F6C  # "evol": the PostgreSQL advisory lock key held while migrating


class ArchiveError(Exception):
    """The archive cannot be opened or used; `str()` says what to do."""


@dataclass(frozen=True)
class ScoredProgram:
    """The slim row the selection indexes are built from (no code, no blobs)."""

    id: int
    island: int
    generation: int
    parent_id: int | None
    scores: dict[str, float]
    scalar: float | None
    error_kind: str | None
    code_length: int


def to_url(target: str | Path) -> str:
    """Kept for callers of the old name: see `archive_url`."""
    return archive_url(target)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    for pragma in ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=30000", "synchronous=NORMAL"):
        cur.execute(f"PRAGMA {pragma}")
    cur.close()


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


class Archive(ArchiveQueries, ParentReads):
    """Writes and single-row reads here; reads over whole runs come from `ArchiveQueries`, what a prompt shows
    about a parent from `ParentReads`."""

    def __init__(self, target: str | Path, *, create: bool = True) -> None:
        try:
            url = archive_url(target)
        except ArchiveUrlError as exc:
            raise ArchiveError(str(exc)) from None
        self.url = display_url(url)  # for messages: never shows a password
        path = sqlite_file(url)
        if path is not None and not create and not path.exists():
            raise ArchiveError(f"{path}: no archive there; run `evolve run PROBLEM --db {path}` first")
        if path is not None and create:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.engine: Engine = create_engine(url, pool_pre_ping=path is None)
        except ModuleNotFoundError:
            raise ArchiveError(missing_driver_hint(url)) from None
        if self.engine.dialect.name == "sqlite":
            event.listen(self.engine, "connect", _sqlite_pragmas)
        try:
            with _file_lock(path if create else None):
                self._migrate(create)
        except OperationalError as exc:
            self.engine.dispose()
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
            raise ArchiveError(
                f"{self.url}: cannot open the archive ({reason}); check the URL and that the server is up"
            ) from None
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    def _migrate(self, create: bool) -> None:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        known = {rev.revision for rev in ScriptDirectory.from_config(cfg).walk_revisions()}
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":  # two engines opening one fresh database migrate one at a time
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
            if inspect(conn).has_table("alembic_version"):
                current = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
                if current and current not in known:
                    raise ArchiveError(
                        f"{self.url}: archive schema {current} is newer than this vpo-evolve knows; "
                        "upgrade vpo-evolve (pip install -U vpo-evolve)"
                    )
            elif not create:
                raise ArchiveError(f"{self.url}: no archive there; run `evolve run PROBLEM --db URL` first")
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions.begin() as s:
            yield s

    # ---- runs -------------------------------------------------------------------------------------------
    def create_run(
        self, problem_name: str, problem_dir: str, fingerprint: str, config: dict[str, Any], seed: int
    ) -> Run:
        with self.session() as s:
            run = Run(
                problem_name=problem_name,
                problem_dir=problem_dir,
                problem_fingerprint=fingerprint,
                config=config,
                seed=seed,
                status="running",
                state={},
            )
            s.add(run)
        return run

    def latest_run(self, problem_name: str | None = None) -> Run | None:
        q = select(Run).order_by(Run.id.desc()).limit(1)
        if problem_name is not None:
            q = q.where(Run.problem_name == problem_name)
        with self.session() as s:
            return s.scalars(q).first()

    def runs(self) -> Sequence[Run]:
        with self.session() as s:
            return s.scalars(select(Run).order_by(Run.id)).all()

    def update_run(self, run_id: int, **values: Any) -> None:
        with self.session() as s:
            s.execute(update(Run).where(Run.id == run_id).values(**values))

    # ---- programs and evaluations -----------------------------------------------------------------------
    def find_program(self, run_id: int, code: str) -> int | None:
        with self.session() as s:
            return s.scalar(select(Program.id).where(Program.run_id == run_id, Program.code_hash == code_hash(code)))

    def add_evaluated_program(
        self,
        run_id: int,
        code: str,
        *,
        parent_id: int | None,
        island: int,
        generation: int,
        evaluation: dict[str, Any],
        variant_id: int | None = None,
    ) -> tuple[int, bool]:
        """Insert a program with its evaluation in one transaction; returns (id, created).

        A program whose normalised code is already there is not inserted again; the existing id returns.
        """
        digest = code_hash(code)
        try:
            with self.session() as s:
                program = Program(
                    run_id=run_id,
                    code=code,
                    code_hash=digest,
                    parent_id=parent_id,
                    island=island,
                    generation=generation,
                )
                s.add(program)
                s.flush()
                s.add(Evaluation(program_id=program.id, **evaluation))
                if variant_id is not None:
                    s.execute(update(Variant).where(Variant.id == variant_id).values(program_id=program.id))
                return program.id, True
        except IntegrityError:
            existing = self.find_program(run_id, code)
            if existing is None:
                raise
            if variant_id is not None:
                self.set_variant(variant_id, status="duplicate", program_id=existing)
            return existing, False

    def program(self, program_id: int) -> Program | None:
        with self.session() as s:
            prog = s.get(Program, program_id)
            if prog is not None:
                _ = prog.evaluation
            return prog

    def scored_programs(self, run_id: int) -> list[ScoredProgram]:
        q = (
            select(
                Program.id,
                Program.island,
                Program.generation,
                Program.parent_id,
                Evaluation.scores,
                Evaluation.scalar,
                Evaluation.error_kind,
                func.length(Program.code),
            )
            .join(Evaluation, Evaluation.program_id == Program.id)
            .where(Program.run_id == run_id)
            .order_by(Program.id)
        )
        with self.session() as s:
            return [ScoredProgram(*row) for row in s.execute(q)]

    def codes(self, program_ids: Sequence[int]) -> dict[int, str]:
        with self.session() as s:
            rows = s.execute(select(Program.id, Program.code).where(Program.id.in_(list(program_ids))))
            return dict(rows.all())

    def add_incident(self, run_id: int, stage: str, kind: str, message: str) -> None:
        with self.session() as s:
            s.add(Incident(run_id=run_id, stage=stage, kind=kind[:100], message=message[:4000]))

    def count_programs(self, run_id: int) -> int:
        with self.session() as s:
            return s.scalar(select(func.count(Program.id)).where(Program.run_id == run_id)) or 0

    # ---- prompts, completions, variants -----------------------------------------------------------------
    def add_group(
        self,
        run_id: int,
        *,
        parent_id: int,
        inspiration_ids: list[int],
        island: int,
        prompt: str,
        sampling: dict[str, Any],
        completions: Sequence[CompletionRecord],
        variants: Sequence[Sequence[tuple[str, str | None, int | None]]],
        telemetry: GroupTelemetry | None = None,
    ) -> list[list[int]]:
        """Store a prompt with its G completions and their parsed variants in one transaction; returns the
        variant ids. `variants[i]` lists (status, detail, program_id) for completion i, in slot order."""
        with self.engine.begin() as conn:
            return write_group(
                conn,
                run_id,
                parent_id=parent_id,
                inspiration_ids=inspiration_ids,
                island=island,
                prompt=prompt,
                sampling=sampling,
                completions=completions,
                variants=variants,
                telemetry=telemetry or GroupTelemetry(),
            )

    def set_variant(self, variant_id: int, **values: Any) -> None:
        with self.session() as s:
            s.execute(update(Variant).where(Variant.id == variant_id).values(**values))

    def pending_variants(self, run_id: int) -> list[PendingVariant]:
        """Variants parsed as new children whose evaluation never landed (the run was killed)."""
        q = (
            select(Variant.id, Variant.slot, Prompt.parent_id, Completion.text, Prompt.island)
            .join(Completion, Completion.id == Variant.completion_id)
            .join(Prompt, Prompt.id == Completion.prompt_id)
            .where(Prompt.run_id == run_id, Variant.status == "ok", Variant.program_id.is_(None))
        )
        with self.session() as s:
            return [PendingVariant(*r) for r in s.execute(q)]

    def count_groups(self, run_id: int) -> int:
        with self.session() as s:
            return s.scalar(select(func.count(Prompt.id)).where(Prompt.run_id == run_id)) or 0

    # ---- policy versions --------------------------------------------------------------------------------
    def add_policy_version(
        self,
        *,
        run_id: int | None,
        base_model: str,
        adapter_path: str | None = None,
        parent_id: int | None = None,
        number: int = 0,
        train_config: dict[str, Any] | None = None,
        stats: dict[str, Any] | None = None,
    ) -> int:
        with self.session() as s:
            v = PolicyVersion(
                run_id=run_id,
                base_model=base_model,
                adapter_path=adapter_path,
                parent_id=parent_id,
                number=number,
                train_config=train_config,
                stats=stats,
            )
            s.add(v)
            s.flush()
            return v.id

    def policy_versions(self, run_id: int | None = None) -> Sequence[PolicyVersion]:
        q = select(PolicyVersion).order_by(PolicyVersion.id)
        if run_id is not None:
            q = q.where(PolicyVersion.run_id == run_id)
        with self.session() as s:
            return s.scalars(q).all()
