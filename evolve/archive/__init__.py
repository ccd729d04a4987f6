"""The archive: every program, prompt, completion and evaluation of a search, in SQL."""

from evolve.archive.batch import NewProgram
from evolve.archive.codehash import code_hash, normalize
from evolve.archive.database import ArchiveError, StorageError, storage_reason
from evolve.archive.facade import Archive
from evolve.archive.group_store import GroupOutcome, GroupRows
from evolve.archive.inserts import CompletionRecord, GroupTelemetry
from evolve.archive.lineage import LineageNode
from evolve.archive.parents import ChildFailure, ParentContext
from evolve.archive.program_store import ScoredProgram
from evolve.archive.records import PolicyVersionRecord, ProgramRecord, RunRecord, RunState, StoredEvaluation
from evolve.archive.session_lock import SessionBusy, SessionLock
from evolve.archive.summary import RunSummary, summary_yield
from evolve.archive.urls import archive_url, sqlite_file

__all__ = [
    "Archive",
    "ArchiveError",
    "ChildFailure",
    "CompletionRecord",
    "GroupOutcome",
    "GroupRows",
    "GroupTelemetry",
    "LineageNode",
    "NewProgram",
    "ParentContext",
    "PolicyVersionRecord",
    "ProgramRecord",
    "RunRecord",
    "RunState",
    "RunSummary",
    "ScoredProgram",
    "SessionBusy",
    "SessionLock",
    "StorageError",
    "StoredEvaluation",
    "archive_url",
    "code_hash",
    "normalize",
    "sqlite_file",
    "storage_reason",
    "summary_yield",
]
