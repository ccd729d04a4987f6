"""Runs, their incidents and their policy versions: the rows a run owns beside its programs and groups.

Reads come back as records (`records.py`), copied while the session is open: a caller never holds a row bound
to a session, so nothing it does to one can write the archive, and what it holds stays readable after close.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import or_, select, update

from evolve.archive.database import ArchiveError, Database
from evolve.archive.models import Incident, PolicyVersion, Run
from evolve.archive.records import PolicyVersionRecord, RunRecord, RunState


class RunStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(
        self, problem_name: str, problem_dir: str, fingerprint: str, config: dict[str, Any], seed: int
    ) -> RunRecord:
        with self.db.session() as s:
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
            s.flush()
            return RunRecord.of(run)

    def all(self) -> list[RunRecord]:
        with self.db.session() as s:
            return [RunRecord.of(run) for run in s.scalars(select(Run).order_by(Run.id))]

    def find(self, run_id: int | None = None, problem_name: str | None = None) -> RunRecord | None:
        """Run `run_id`; without one, the latest run (of `problem_name` when given), None when there is none.

        The one run lookup of the engine: `evolve run` resuming and every command's `--run` go through it, so
        "latest" and "no such run" mean the same everywhere. A `run_id` the archive lacks is an `ArchiveError`
        that lists the runs it has.
        """
        if run_id is not None:
            with self.db.session() as s:
                row = s.get(Run, run_id)
                run = None if row is None else RunRecord.of(row)
            if run is None:
                ids = [r.id for r in self.all()]
                held = f"runs are {ids}" if ids else "the archive holds no run yet"
                raise ArchiveError(f"{self.db.url}: no run {run_id}; {held}")
            return run
        q = select(Run).order_by(Run.id.desc()).limit(1)
        if problem_name is not None:
            q = q.where(Run.problem_name == problem_name)
        with self.db.session() as s:
            row = s.scalars(q).first()
            return None if row is None else RunRecord.of(row)

    def update(
        self,
        run_id: int,
        *,
        status: str | None = None,
        config: dict[str, Any] | None = None,
        state: RunState | None = None,
        problem_dir: str | None = None,
        fingerprint: str | None = None,
    ) -> None:
        """Write the values given (None: left as stored) in one statement; the run's `updated_at` moves, which
        is the heartbeat `shown_status` reads. A resume from a folder that moved gives its new `problem_dir`, and one
        of a run older than per-file hashes its new kind of `fingerprint` (evolve/runs.py), with the config that
        records them: one statement, so the columns never disagree with the config."""
        values: dict[str, Any] = {
            "status": status,
            "config": config,
            "state": None if state is None else state.as_json(),
            "problem_dir": problem_dir,
            "problem_fingerprint": fingerprint,
        }
        given = {k: v for k, v in values.items() if v is not None}
        if not given:
            return
        with self.db.session() as s:
            s.execute(update(Run).where(Run.id == run_id).values(**given))

    def add_incident(self, run_id: int, stage: str, kind: str, message: str) -> None:
        with self.db.session() as s:
            s.add(Incident(run_id=run_id, stage=stage, kind=kind[:100], message=message[:4000]))

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
        member: str | None = None,
    ) -> int:
        with self.db.session() as s:
            v = PolicyVersion(
                run_id=run_id,
                base_model=base_model,
                member=member,
                adapter_path=adapter_path,
                parent_id=parent_id,
                number=number,
                train_config=train_config,
                stats=stats,
            )
            s.add(v)
            s.flush()
            return v.id

    def policy_versions(
        self, run_id: int | None = None, member: str | None = None, *, with_unnamed: bool = False
    ) -> list[PolicyVersionRecord]:
        """The run's policy versions; with `member`, that member's lineage only (`with_unnamed`: also the rows
        of archives older than ensembles, which name no member and belong to the run's first one)."""
        q = select(PolicyVersion).order_by(PolicyVersion.id)
        if run_id is not None:
            q = q.where(PolicyVersion.run_id == run_id)
        if member is not None:
            named = PolicyVersion.member == member
            q = q.where(or_(named, PolicyVersion.member.is_(None)) if with_unnamed else named)
        with self.db.session() as s:
            return [PolicyVersionRecord.of(v) for v in s.scalars(q)]
