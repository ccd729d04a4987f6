"""The archive's tables. Every program, prompt, completion and evaluation of a search is kept here.

Token ids and logprobs are packed little-endian arrays (int32 / float32, `packed.py`), not JSON: a long run
stores millions of them and the trainer reads them back in bulk. Only the archive's own modules import these
classes; everything outside it gets records (`records.py`), never a row bound to a session.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar

from sqlalchemy import JSON, DateTime, Float, ForeignKey, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from evolve.archive.clock import utcnow
from evolve.archive.packed import unpack


class Base(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    problem_name: Mapped[str] = mapped_column(String(200))
    problem_dir: Mapped[str] = mapped_column(Text)
    problem_fingerprint: Mapped[str] = mapped_column(String(64))
    config: Mapped[dict[str, Any]]
    seed: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20), default="running")
    state: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)


class PolicyVersion(Base):
    __tablename__ = "policy_versions"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"))
    number: Mapped[int] = mapped_column(Integer, default=0)
    base_model: Mapped[str] = mapped_column(Text)
    # The ensemble member whose lineage this version is (None in archives older than ensembles: the run's first).
    member: Mapped[str | None] = mapped_column(String(200))
    adapter_path: Mapped[str | None] = mapped_column(Text)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("policy_versions.id"))
    train_config: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    stats: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Program(Base):
    __tablename__ = "programs"
    __table_args__ = (Index("ix_programs_run_hash", "run_id", "code_hash", unique=True),)
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    code: Mapped[str] = mapped_column(Text)  # empty for a program of several files: see ProgramFile
    code_hash: Mapped[str] = mapped_column(String(64))
    # A program of several files: the length of its joined text (evolve/filetree.py); None for one file.
    tree_length: Mapped[int | None] = mapped_column(Integer)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("programs.id"), index=True)
    island: Mapped[int] = mapped_column(Integer, default=0)
    generation: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    evaluation: Mapped[Evaluation | None] = relationship(back_populates="program", uselist=False)


class ProgramBlob(Base):
    """The text of one file, stored once however many programs hold it (its sha256 is its key)."""

    __tablename__ = "program_blobs"
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    text: Mapped[str] = mapped_column(Text)


class ProgramFile(Base):
    """File `position` of a program of several files: its path and the blob holding its text."""

    __tablename__ = "program_files"
    program_id: Mapped[int] = mapped_column(ForeignKey("programs.id"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    path: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(ForeignKey("program_blobs.digest"))


class Evaluation(Base):
    __tablename__ = "evaluations"
    id: Mapped[int] = mapped_column(primary_key=True)
    program_id: Mapped[int] = mapped_column(ForeignKey("programs.id"), unique=True)
    scores: Mapped[dict[str, Any]]
    scalar: Mapped[float | None] = mapped_column(Float)
    error_kind: Mapped[str | None] = mapped_column(String(20), index=True)
    error: Mapped[str | None] = mapped_column(Text)
    duration_s: Mapped[float] = mapped_column(Float)
    # A program of another language: the seconds its [build] took, within duration_s (None: Python, or older).
    build_s: Mapped[float | None] = mapped_column(Float)
    feedback: Mapped[str | None] = mapped_column(Text)
    stages: Mapped[list[Any] | None] = mapped_column(JSON)  # cascade evaluators: each stage's metrics
    stdout: Mapped[str | None] = mapped_column(Text)
    stderr: Mapped[str | None] = mapped_column(Text)
    sandbox: Mapped[str] = mapped_column(String(20))
    case_errors: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # case name → error, split form
    started_at: Mapped[datetime | None] = mapped_column(DateTime)  # when the sandbox got the program
    finished_at: Mapped[datetime | None] = mapped_column(DateTime)  # when its reply came back
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
    program: Mapped[Program] = relationship(back_populates="evaluation")


class Prompt(Base):
    __tablename__ = "prompts"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    parent_id: Mapped[int] = mapped_column(ForeignKey("programs.id"))
    inspiration_ids: Mapped[list[Any]]
    island: Mapped[int] = mapped_column(Integer, default=0)
    text: Mapped[str] = mapped_column(Text)
    # Telemetry of the group sampled from this prompt (None in archives older than it).
    tokens: Mapped[int | None] = mapped_column(Integer)  # tokens generated over its G completions
    generation_s: Mapped[float | None] = mapped_column(Float)  # seconds spent sampling them
    parse_counts: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # variant status → count
    started_at: Mapped[datetime | None] = mapped_column(DateTime)  # sampling began; created_at: stored
    member: Mapped[str | None] = mapped_column(String(200))  # the ensemble member that sampled it (evolve.members)
    ask: Mapped[str | None] = mapped_column(String(40))  # the ask arm it was sampled with (evolve.adapt)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Incident(Base):
    """An unexpected exception that cost one group or one child (the run went on); `inspect` lists them."""

    __tablename__ = "incidents"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    stage: Mapped[str] = mapped_column(String(20))  # prompt | sample | parse | store | evaluate | commit
    kind: Mapped[str] = mapped_column(String(100))  # the exception's class name
    message: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)


class Completion(Base):
    """One completion of a prompt; the completions of one prompt are one group."""

    __tablename__ = "completions"
    id: Mapped[int] = mapped_column(primary_key=True)
    prompt_id: Mapped[int] = mapped_column(ForeignKey("prompts.id"), index=True)
    policy_version_id: Mapped[int | None] = mapped_column(ForeignKey("policy_versions.id"), index=True)
    sampling: Mapped[dict[str, Any]]
    text: Mapped[str] = mapped_column(Text)
    token_ids: Mapped[bytes | None] = mapped_column(LargeBinary)
    logprobs: Mapped[bytes | None] = mapped_column(LargeBinary)
    finish_reason: Mapped[str | None] = mapped_column(String(20))
    created_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)

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
    status: Mapped[str] = mapped_column(String(20))
    detail: Mapped[str | None] = mapped_column(Text)
    program_id: Mapped[int | None] = mapped_column(ForeignKey("programs.id"), index=True)


class SamplingProgressRow(Base):
    """The group a run is sampling now (one row per run, overwritten every few seconds while it samples; `data`
    is None between groups): the run's process publishes it so that `evolve serve`, another process, shows it."""

    __tablename__ = "sampling_progress"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime, default=utcnow)
