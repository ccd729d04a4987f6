"""The archive: every program, prompt, completion and evaluation of a search, in SQL."""

from evolve.archive.codehash import code_hash, normalize
from evolve.archive.parents import ParentContext
from evolve.archive.queries import GroupRows, RunSummary, summary_yield
from evolve.archive.store import (
    Archive,
    ArchiveError,
    CompletionRecord,
    GroupTelemetry,
    ScoredProgram,
)
from evolve.archive.urls import archive_url, sqlite_file

__all__ = [
    "Archive",
    "ArchiveError",
    "CompletionRecord",
    "GroupRows",
    "GroupTelemetry",
    "ParentContext",
    "RunSummary",
    "ScoredProgram",
    "archive_url",
    "code_hash",
    "normalize",
    "sqlite_file",
    "summary_yield",
]
