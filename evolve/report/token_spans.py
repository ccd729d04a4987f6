"""When each completion's tokens were sampled: the span of its group's sampling, for the throughput view.

A completion is stored when its group ends, but its tokens came over the whole group (minutes on a CPU). The
group's telemetry has when sampling began and how long it took (`Prompt.started_at`, `generation_s`); an
archive older than that telemetry has only the completion's time, and its tokens stay at that instant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evolve.archive import Archive
from evolve.report.queries import times


@dataclass(frozen=True)
class TokenSpans:
    start: np.ndarray  # datetime64: sampling of the completion's group began (its end where unknown)
    end: np.ndarray  # datetime64: it ended (started_at + generation_s, else the completion's time)
    tokens: np.ndarray  # float: tokens of the completion (0 where the backend gave no ids)


def token_spans(archive: Archive, run_id: int) -> TokenSpans:
    rows = archive.report_reads.token_rows(run_id)
    stored = times(rows.completed_at)
    started = times(rows.started_at)
    seconds = np.array([np.nan if s is None else float(s) for s in rows.generation_s], dtype=float)
    known = ~np.isnat(started) & ~np.isnan(seconds)
    sampled = np.where(known, np.nan_to_num(seconds) * 1e6, 0).astype("timedelta64[us]")
    end = np.where(known, started + sampled, stored)
    start = np.where(known, started, end)
    return TokenSpans(start, end, np.array(rows.tokens, dtype=float))
