"""The archive: every program, prompt, completion and evaluation of a search, in SQL."""

from evolve.archive.codehash import code_hash, normalize
from evolve.archive.queries import GroupRows, RunSummary
from evolve.archive.store import Archive, ArchiveError, CompletionRecord, ScoredProgram

__all__ = [
    "Archive",
    "ArchiveError",
    "CompletionRecord",
    "GroupRows",
    "RunSummary",
    "ScoredProgram",
    "code_hash",
    "normalize",
]
