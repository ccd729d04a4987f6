"""The archive's tables. Every program, prompt, completion and evaluation of a search is kept here.

Token ids and logprobs are packed little-endian arrays (int32 / float32, `packed.py`), not JSON: a long run
stores millions of them and the trainer reads them back in bulk. Only the archive's own modules import these
classes; everything outside it gets records (`records.py`), never a row bound to a session.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, DateTime, Dialect, Float, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from evolve.archive.clock import utcnow
from evolve.archive.packed import unpack
from evolve.storable import storable_text


def storable_json(value: Any) -> Any:
    """A JSON value with every string in it (keys too) made storable: a JSON column's lone surrogate is written as a
    `\\udcXX` escape, which PostgreSQL refuses and every reader gets back as the surrogate again."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {storable_json(k): storable_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [storable_json(v) for v in value]
    return value


class StorableText(TypeDecorator[str]):
    """Text, stored as valid UTF-8 (`storable_text`): the ORM and the Core inserts (batch.py, inserts.py) both bind
    through it, so no text from a reply, an evaluator or a model can make a commit fail."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else storable_text(value)


class StorableString(StorableText):
    """A bounded string, stored as `StorableText` is."""

    impl = String
    cache_ok = True


class StorableJSON(TypeDecorator[Any]):
    """JSON whose strings are stored as valid UTF-8 (`storable_json`)."""

    impl = JSON
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        return storable_json(value)


class UnreadableValue(ValueError):
    """A stored value its column's type cannot read back (a time written over by hand): the archive's damage, which
    `Database.session` reports in one line with the archive's name, never a bare `ValueError` from deep in a read."""


SHOWN_VALUE = 80  # characters of an unreadable value a message quotes: it names the value, not all of it


class StoredTime(TypeDecorator[datetime]):
    """A `DateTime` whose stored text SQLite's reader cannot parse raises `UnreadableValue`, not the `ValueError`
    ("Invalid isoformat string") that a command would show as a traceback, or that a run would count as a failed
    parse. It wraps the dialect's own processor (SQLite stores times as text; PostgreSQL returns them parsed)
    rather than overriding `process_result_value`, which runs only after that processor has already failed."""

    impl = DateTime
    cache_ok = True

    def result_processor(self, dialect: Dialect, coltype: Any) -> Callable[[Any], datetime | None] | None:
        read = super().result_processor(dialect, coltype)
        if read is None:
            return None

        def checked(value: Any) -> datetime | None:
            try:
                return read(value)
            except (ValueError, TypeError):
                shown = repr(value)
                shown = shown if len(shown) <= SHOWN_VALUE else shown[: SHOWN_VALUE - 3] + "..."
                raise UnreadableValue(f"a stored time does not parse: {shown}") from None

        return checked


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {
        dict[str, Any]: StorableJSON,
        list[Any]: StorableJSON,
        datetime: StoredTime,
    }


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    problem_name: Mapped[str] = mapped_column(StorableString(200))
    problem_dir: Mapped[str] = mapped_column(StorableText)
    problem_fingerprint: Mapped[str] = mapped_column(StorableString(64))
    config: Mapped[dict[str, Any]]
    seed: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(StorableString(20), default="running")
    state: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(StoredTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(StoredTime, default=utcnow, onupdate=utcnow)


class PolicyVersion(Base):
    __tablename__ = "policy_versions"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    number: Mapped[int] = mapped_column(Integer, default=0)
    base_model: Mapped[str] = mapped_column(StorableText)
    # The ensemble member whose lineage this version is (None in archives older than ensembles: the run's first).
    member: Mapped[str | None] = mapped_column(StorableString(200))
    adapter_path: Mapped[str | None] = mapped_column(StorableText)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("policy_versions.id"))
    train_config: Mapped[dict[str, Any] | None] = mapped_column(StorableJSON)
    stats: Mapped[dict[str, Any] | None] = mapped_column(StorableJSON)
    created_at: Mapped[datetime] = mapped_column(StoredTime, default=utcnow)


class Program(Base):
    __tablename__ = "programs"
    __table_args__ = (Index("ix_programs_run_hash", "run_id", "code_hash", unique=True),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    code: Mapped[str] = mapped_column(StorableText)  # empty for a program of several files: see ProgramFile
    code_hash: Mapped[str] = mapped_column(StorableString(64))
    # A program of several files: the length of its joined text (evolve/filetree.py); None for one file.
    tree_length: Mapped[int | None] = mapped_column(Integer)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("programs.id"), index=True)
    island: Mapped[int] = mapped_column(Integer, default=0)
    generation: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(StoredTime, default=utcnow)
    evaluation: Mapped[Evaluation | None] = relationship(back_populates="program", uselist=False)


class ProgramBlob(Base):
    """The text of one file, stored once however many programs hold it (its sha256 is its key)."""

    __tablename__ = "program_blobs"
    digest: Mapped[str] = mapped_column(StorableString(64), primary_key=True)
    text: Mapped[str] = mapped_column(StorableText)


class ProgramFile(Base):
    """File `position` of a program of several files: its path and the blob holding its text."""

    __tablename__ = "program_files"
    program_id: Mapped[int] = mapped_column(ForeignKey("programs.id"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(StorableText)
    digest: Mapped[str] = mapped_column(ForeignKey("program_blobs.digest"))


class Evaluation(Base):
    __tablename__ = "evaluations"
    id: Mapped[int] = mapped_column(primary_key=True)
    program_id: Mapped[int] = mapped_column(ForeignKey("programs.id"), unique=True)
    scores: Mapped[dict[str, Any]]
    scalar: Mapped[float | None] = mapped_column(Float)
    error_kind: Mapped[str | None] = mapped_column(StorableString(20), index=True)
    error: Mapped[str | None] = mapped_column(StorableText)
    duration_s: Mapped[float] = mapped_column(Float)
    # A program of another language: the seconds its [build] took, within duration_s (None: Python, or older).
    build_s: Mapped[float | None] = mapped_column(Float)
    feedback: Mapped[str | None] = mapped_column(StorableText)
    stages: Mapped[list[Any] | None] = mapped_column(StorableJSON)  # cascade evaluators: each stage's metrics
    stdout: Mapped[str | None] = mapped_column(StorableText)
    stderr: Mapped[str | None] = mapped_column(StorableText)
    sandbox: Mapped[str] = mapped_column(StorableString(20))
    case_errors: Mapped[dict[str, Any] | None] = mapped_column(StorableJSON)  # case name → error, split form
    # What the candidate's code raised into the evaluator's, most frequent first: [{type, message, file, line, count}]
    swallowed: Mapped[list[Any] | None] = mapped_column(StorableJSON)
    # The seed's evaluation only: the first call of each function its fixed code calls, with the real arguments
    # (`priority({'time': 11, ...})`), which prompts show; None for every other program and in older archives.
    first_calls: Mapped[list[Any] | None] = mapped_column(StorableJSON)
    started_at: Mapped[datetime | None] = mapped_column(StoredTime)  # when the sandbox got the program
    finished_at: Mapped[datetime | None] = mapped_column(StoredTime)  # when its reply came back
    created_at: Mapped[datetime] = mapped_column(StoredTime, default=utcnow)
    program: Mapped[Program] = relationship(back_populates="evaluation")


class Prompt(Base):
    __tablename__ = "prompts"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    parent_id: Mapped[int] = mapped_column(ForeignKey("programs.id"))
    inspiration_ids: Mapped[list[Any]]
    island: Mapped[int] = mapped_column(Integer, default=0)
    text: Mapped[str] = mapped_column(StorableText)
    # Telemetry of the group sampled from this prompt (None in archives older than it).
    tokens: Mapped[int | None] = mapped_column(Integer)  # tokens generated over its G completions
    generation_s: Mapped[float | None] = mapped_column(Float)  # seconds spent sampling them
    parse_counts: Mapped[dict[str, Any] | None] = mapped_column(StorableJSON)  # variant status → count
    started_at: Mapped[datetime | None] = mapped_column(StoredTime)  # sampling began; created_at: stored
    member: Mapped[str | None] = mapped_column(StorableString(200))  # the ensemble member that sampled it (members.py)
    ask: Mapped[str | None] = mapped_column(StorableString(40))  # the ask arm it was sampled with (evolve.ask_arms)
    created_at: Mapped[datetime] = mapped_column(StoredTime, default=utcnow)


class Incident(Base):
    """An unexpected exception that cost one group or one child (the run went on); `inspect` lists them."""

    __tablename__ = "incidents"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    stage: Mapped[str] = mapped_column(StorableString(20))  # prompt | sample | parse | store | evaluate | commit
    kind: Mapped[str] = mapped_column(StorableString(100))  # the exception's class name
    message: Mapped[str] = mapped_column(StorableText)
    created_at: Mapped[datetime] = mapped_column(StoredTime, default=utcnow)


class Completion(Base):
    """One completion of a prompt; the completions of one prompt are one group."""

    __tablename__ = "completions"
    id: Mapped[int] = mapped_column(primary_key=True)
    prompt_id: Mapped[int] = mapped_column(ForeignKey("prompts.id"), index=True)
    policy_version_id: Mapped[int | None] = mapped_column(ForeignKey("policy_versions.id"), index=True)
    sampling: Mapped[dict[str, Any]]
    text: Mapped[str] = mapped_column(StorableText)
    token_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    logprobs: Mapped[bytes | None] = mapped_column(LargeBinary)
    finish_reason: Mapped[str | None] = mapped_column(StorableString(20))
    created_at: Mapped[datetime] = mapped_column(StoredTime, default=utcnow)

    @property
    def token_id_list(self) -> list[int] | None:
        return unpack(self.token_ids, "i")

    @property
    def logprob_list(self) -> list[float] | None:
        return unpack(self.logprobs, "f")


class Variant(Base):
    """Answer `slot` of a completion: a parse status, and the child program it made (if any)."""

    __tablename__ = "variants"
    id: Mapped[int] = mapped_column(primary_key=True)
    completion_id: Mapped[int] = mapped_column(ForeignKey("completions.id"), index=True)
    slot: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(StorableString(20))
    detail: Mapped[str | None] = mapped_column(StorableText)
    program_id: Mapped[int | None] = mapped_column(ForeignKey("programs.id"), index=True)


class SamplingProgressRow(Base):
    """The group a run is sampling now (one row per run, overwritten every few seconds while it samples; `data`
    is None between groups): the run's process publishes it so that `evolve serve`, another process, shows it."""

    __tablename__ = "sampling_progress"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    data: Mapped[dict[str, Any] | None] = mapped_column(StorableJSON, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(StoredTime, default=utcnow)
