"""The group a run is sampling, published through the archive: the run writes a small row every few seconds,
`evolve serve` (another process, maybe on another machine with a PostgreSQL archive) reads it.

Why the archive and not a file beside it: the archive is the one thing both processes share, whatever its URL.
Why its own table: the run's row is rewritten by the loop with its own copy of the run's state, and a change of
that row moves the dashboard's change key (a rebuild of every view); this row moves neither.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sqlalchemy import insert, select, update

from evolve.archive.clock import utcnow
from evolve.archive.facade import Archive
from evolve.archive.models import SamplingProgressRow


@dataclass(frozen=True)
class SamplingSnapshot:
    rows: int
    rows_done: int
    tokens: int
    prompt_tokens: int  # prompt tokens this group decodes (those cached from the previous group excluded)
    elapsed_s: float  # when it was written


@dataclass(frozen=True)
class PublishedSampling:
    snapshot: SamplingSnapshot
    age_s: float  # since it was written

    @property
    def elapsed_s(self) -> float:
        return self.snapshot.elapsed_s + self.age_s

    def line(self) -> str:
        """As the run's live view says it, e.g. `sampling 4 rows: 312 tokens, 9.8 tok/s, 1/4 rows done, 31 s`."""
        s = self.snapshot
        if not s.tokens:
            return f"sampling {s.rows} rows: reading the prompt ({s.prompt_tokens} new tokens), {self.elapsed_s:.0f} s"
        rate = s.tokens / max(s.elapsed_s, 1e-9)
        return (
            f"sampling {s.rows} rows: {s.tokens} tokens, {rate:.1f} tok/s, {s.rows_done}/{s.rows} rows done, "
            f"{self.elapsed_s:.0f} s"
        )


def publish_sampling(archive: Archive, run_id: int, snapshot: SamplingSnapshot | None) -> None:
    """One UPDATE (an INSERT the first time); None says that no group is being sampled."""
    data = asdict(snapshot) if snapshot is not None else None
    now = utcnow()
    with archive.db.session() as s:
        changed = s.execute(
            update(SamplingProgressRow).where(SamplingProgressRow.run_id == run_id).values(data=data, updated_at=now)
        ).rowcount
        if not changed:
            s.execute(insert(SamplingProgressRow).values(run_id=run_id, data=data, updated_at=now))


def published_sampling(archive: Archive, run_id: int) -> PublishedSampling | None:
    """The group `run_id` was sampling when it last wrote, or None (between groups, or never published)."""
    with archive.db.session() as s:
        row = s.execute(
            select(SamplingProgressRow.data, SamplingProgressRow.updated_at).where(SamplingProgressRow.run_id == run_id)
        ).first()
    if row is None or not row.data:
        return None
    age = max(0.0, (utcnow() - row.updated_at).total_seconds())
    return PublishedSampling(SamplingSnapshot(**row.data), age)
