"""The archive: every program, prompt, completion and evaluation of a search, in SQL."""

from evolve.archive.codehash import code_hash, normalize
from evolve.archive.queries import GroupRows, RunSummary
from evolve.archive.store import (
    Archive,
    ArchiveError,
    CompletionRecord,
    GroupTelemetry,
    ParentContext,
    ScoredProgram,
)

__all__ = [
    "Archive",
    "ArchiveError",
    "CompletionRecord",
    "GroupRows",
    "GroupTelemetry",
    "ParentContext",
    "RunSummary",
    "ScoredProgram",
    "code_hash",
    "normalize",
]
