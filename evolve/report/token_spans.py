"""When each completion's tokens were sampled: the span of its group's sampling, for the throughput view.

A completion is stored when its group ends, but its tokens came over the whole group (minutes on a CPU). The
group's telemetry has when sampling began and how long it took (`Prompt.started_at`, `generation_s`); an
archive older than that telemetry has only the completion's time, and its tokens stay at that instant.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import func, select

from evolve.archive import Archive
from evolve.archive.models import Completion, Prompt
from evolve.report.queries import as_text, times


@dataclass(frozen=True)
class TokenSpans:
    start: np.ndarray  # datetime64: sampling of the completion's group began (its end where unknown)
    end: np.ndarray  # datetime64: it ended (started_at + generation_s, else the completion's time)
    tokens: np.ndarray  # float: tokens of the completion (0 where the backend gave no ids)


def token_spans(archive: Archive, run_id: int) -> TokenSpans:
    q = (
        select(
            as_text(Completion.created_at),
            func.coalesce(func.length(Completion.token_ids), 0) / 4,
            as_text(Prompt.started_at),
            Prompt.generation_s,
        )
        .join(Prompt, Prompt.id == Completion.prompt_id)
        .where(Prompt.run_id == run_id)
    )
    with archive.engine.connect() as conn:
        rows = conn.execute(q).all()
    stored = times([r[0] for r in rows])
    started = times([r[2] for r in rows])
    seconds = np.array([np.nan if r[3] is None else float(r[3]) for r in rows], dtype=float)
    known = ~np.isnat(started) & ~np.isnan(seconds)
    sampled = np.where(known, np.nan_to_num(seconds) * 1e6, 0).astype("timedelta64[us]")
    end = np.where(known, started + sampled, stored)
    start = np.where(known, started, end)
    return TokenSpans(start, end, np.array([int(r[1]) for r in rows], dtype=float))
