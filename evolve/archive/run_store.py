"""Runs, their incidents and their policy versions: the rows a run owns beside its programs and groups."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import or_, select, update

from evolve.archive.database import ArchiveError, Database
from evolve.archive.models import Incident, PolicyVersion, Run


class RunStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, problem_name: str, problem_dir: str, fingerprint: str, config: dict[str, Any], seed: int) -> Run:
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
        return run

    def all(self) -> Sequence[Run]:
        with self.db.session() as s:
            return s.scalars(select(Run).order_by(Run.id)).all()

    def find(self, run_id: int | None = None, problem_name: str | None = None) -> Run | None:
        """Run `run_id`; without one, the latest run (of `problem_name` when given), None when there is none.

        The one run lookup of the engine: `evolve run` resuming and every command's `--run` go through it, so
        "latest" and "no such run" mean the same everywhere. A `run_id` the archive lacks is an `ArchiveError`
        that lists the runs it has.
        """
        if run_id is not None:
            with self.db.session() as s:
                run = s.get(Run, run_id)
            if run is None:
                ids = [r.id for r in self.all()]
                held = f"runs are {ids}" if ids else "the archive holds no run yet"
                raise ArchiveError(f"{self.db.url}: no run {run_id}; {held}")
            return run
        q = select(Run).order_by(Run.id.desc()).limit(1)
        if problem_name is not None:
            q = q.where(Run.problem_name == problem_name)
        with self.db.session() as s:
            return s.scalars(q).first()

    def update(self, run_id: int, **values: Any) -> None:
        with self.db.session() as s:
            s.execute(update(Run).where(Run.id == run_id).values(**values))

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
    ) -> Sequence[PolicyVersion]:
        """The run's policy versions; with `member`, that member's lineage only (`with_unnamed`: also the rows
        of archives older than ensembles, which name no member and belong to the run's first one)."""
        q = select(PolicyVersion).order_by(PolicyVersion.id)
        if run_id is not None:
            q = q.where(PolicyVersion.run_id == run_id)
        if member is not None:
            named = PolicyVersion.member == member
            q = q.where(or_(named, PolicyVersion.member.is_(None)) if with_unnamed else named)
        with self.db.session() as s:
            return s.scalars(q).all()
