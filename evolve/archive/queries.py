"""The archive's read side beyond single rows: summaries, best programs, lineages and training groups.

These are methods of `Archive` (mixed in here to keep `store.py` small), so every read of the archive goes
through one object. They scan a run once per call; nothing here runs per iteration.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from evolve.archive.models import (
    Completion,
    Evaluation,
    Incident,
    PolicyVersion,
    Program,
    Prompt,
    Run,
    Variant,
    utcnow,
)
from evolve.fitness import better
from evolve.problem.config import FitnessSection
from evolve.yields import Yield


@dataclass
class RunSummary:
    run_id: int
    problem: str
    status: str
    programs: int = 0
    evaluations: int = 0
    groups: int = 0
    completions: int = 0
    variants: dict[str, int] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)
    islands: dict[int, int] = field(default_factory=dict)
    best_scalar: tuple[int, float] | None = None
    best_components: dict[str, tuple[int, float]] = field(default_factory=dict)
    policy_versions: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0
    stop_reason: str | None = None
    interruptions: int = 0  # sessions that ended by a kill (found `running` by the next command)
    options: dict[str, Any] = field(default_factory=dict)  # what the run runs with now
    overrides: list[dict[str, Any]] = field(default_factory=list)  # options changed on resume, when, from → to
    incidents: dict[str, int] = field(default_factory=dict)  # "stage: kind" → count
    last_incident: str | None = None
    telemetry: dict[str, float | int | None] = field(default_factory=dict)
    yields: dict[str, float | int] = field(default_factory=dict)  # evolve.yields.Yield.as_dict()
    adaptations: list[dict[str, Any]] = field(default_factory=list)  # changes of the ask (evolve.adapt)


def summary_yield(s: RunSummary) -> Yield:
    """The run's yield from its summary's counts: completions, tokens, valid children, variant statuses."""
    tokens, valid = s.telemetry.get("tokens"), s.telemetry.get("valid_children")
    return Yield(s.completions, int(tokens or 0), int(valid or 0), s.variants)


HEARTBEAT_STALE_S = 60.0  # a `running` run not heard from for this long was killed


def shown_status(run: Run, now: datetime | None = None) -> str:
    """`running`, unless its heartbeat (saved every few seconds) stopped: then it was killed, `interrupted`."""
    if run.status != "running":
        return run.status
    age = ((now or utcnow()) - run.updated_at).total_seconds()
    return "interrupted" if age > HEARTBEAT_STALE_S else "running"


@dataclass(frozen=True)
class GroupRows:
    """The raw rows of training groups: prompts (id, text) newest first, their completions, and the answers
    as (completion_id, slot, status, scores, error_kind), scores present only for evaluated answers."""

    prompts: list[tuple[int, str]]
    completions: list[Completion]
    answers: list[tuple[int, int, str, dict[str, float] | None, str | None]]


class ArchiveQueries:
    """Read methods of `Archive` over whole runs; they need only `session()` and `program()`."""

    def session(self) -> AbstractContextManager[Session]: ...  # provided by Archive

    def program(self, program_id: int) -> Program | None: ...  # provided by Archive

    def policy_versions(self, run_id: int | None = None) -> Sequence[PolicyVersion]: ...  # provided by Archive

    def summarize(self, run: Run) -> RunSummary:
        out = RunSummary(
            run.id,
            run.problem_name,
            shown_status(run),
            elapsed_s=float(run.state.get("elapsed_s", 0.0)),
            stop_reason=run.state.get("stop_reason"),
            interruptions=int(run.state.get("interruptions", 0)),
            options=dict(run.config.get("options", {})),
            overrides=list(run.config.get("overrides", [])),
            adaptations=list(run.state.get("adaptations", [])),
        )
        components = {c.name: c for c in FitnessSection.model_validate(run.config["problem"]["fitness"]).resolved()}
        with self.session() as s:
            out.programs = s.scalar(select(func.count(Program.id)).where(Program.run_id == run.id)) or 0
            out.groups = s.scalar(select(func.count(Prompt.id)).where(Prompt.run_id == run.id)) or 0
            out.completions = (
                s.scalar(select(func.count(Completion.id)).join(Prompt).where(Prompt.run_id == run.id)) or 0
            )
            rows = s.execute(
                select(Variant.status, func.count())
                .join(Completion)
                .join(Prompt)
                .where(Prompt.run_id == run.id)
                .group_by(Variant.status)
            )
            out.variants = dict(rows.all())
            out.islands = dict(
                s.execute(
                    select(Program.island, func.count()).where(Program.run_id == run.id).group_by(Program.island)
                ).all()
            )
            errors: Counter[str] = Counter()
            for pid, scores, scalar, kind in s.execute(
                select(Evaluation.program_id, Evaluation.scores, Evaluation.scalar, Evaluation.error_kind)
                .join(Program)
                .where(Program.run_id == run.id)
            ):
                out.evaluations += 1
                if kind:
                    errors[kind] += 1
                    continue
                if out.best_scalar is None or scalar > out.best_scalar[1]:
                    out.best_scalar = (pid, scalar)
                for name, value in scores.items():
                    held = out.best_components.get(name)
                    spec = components.get(name)
                    if held is None or (better(spec, value, held[1]) if spec else value > held[1]):
                        out.best_components[name] = (pid, value)
            out.errors = dict(errors)
            self._incidents_and_telemetry(s, run, out)
        out.policy_versions = [
            {
                "id": v.id,
                "number": v.number,
                "base_model": v.base_model,
                "adapter": v.adapter_path,
                "parent": v.parent_id,
            }
            for v in self.policy_versions(run.id)
        ]
        return out

    @staticmethod
    def _incidents_and_telemetry(s: Session, run: Run, out: RunSummary) -> None:
        incidents = s.execute(
            select(Incident.stage, Incident.kind, func.count()).where(Incident.run_id == run.id).group_by(
                Incident.stage, Incident.kind
            )
        ).all()
        out.incidents = {f"{stage}: {kind}": n for stage, kind, n in incidents}
        last = s.execute(
            select(Incident.stage, Incident.kind, Incident.message)
            .where(Incident.run_id == run.id)
            .order_by(Incident.id.desc())
            .limit(1)
        ).first()
        out.last_incident = f"{last[0]}: {last[1]}: {last[2][:300]}" if last else None
        tokens, gen_s = s.execute(
            select(func.sum(Prompt.tokens), func.sum(Prompt.generation_s)).where(Prompt.run_id == run.id)
        ).one()
        valid_children = (
            s.scalar(
                select(func.count(Program.id))
                .join(Evaluation)
                .where(Program.run_id == run.id, Program.parent_id.is_not(None), Evaluation.error_kind.is_(None))
            )
            or 0
        )
        minutes = out.elapsed_s / 60.0
        out.telemetry = {
            "tokens": tokens,
            "generation_s": gen_s,
            "tokens_per_s": tokens / gen_s if tokens and gen_s else None,
            "evaluations_per_min": out.evaluations / minutes if minutes > 0 else None,
            "valid_children": valid_children,
            "valid_children_per_1k_tokens": 1000.0 * valid_children / tokens if tokens else None,
        }
        out.yields = summary_yield(out).as_dict()

    def best_program(self, run: Run, component: str | None = None) -> Program | None:
        """The best by scalar view, or by one component (in its own direction)."""
        if component is None:
            with self.session() as s:
                q = (
                    select(Program)
                    .join(Evaluation)
                    .where(Program.run_id == run.id, Evaluation.error_kind.is_(None))
                    .order_by(Evaluation.scalar.desc(), Program.id)
                    .limit(1)
                )
                return s.scalars(q).first()
        summary = self.summarize(run)
        if component not in summary.best_components:
            return None
        return self.program(summary.best_components[component][0])

    def lineage(self, program_id: int, limit: int = 50) -> list[Program]:
        """The program, its parent, and so on up to `limit` ancestors."""
        chain = []
        current = self.program(program_id)
        while current is not None and len(chain) < limit:
            chain.append(current)
            current = self.program(current.parent_id) if current.parent_id else None
        return chain

    def evaluation_rows(self, run: Run) -> list[tuple[Program, Evaluation]]:
        with self.session() as s:
            rows = s.execute(
                select(Program, Evaluation).join(Evaluation).where(Program.run_id == run.id).order_by(Program.id)
            )
            return [tuple(r) for r in rows]  # type: ignore[misc]

    def code_hashes(self, run_id: int) -> dict[str, int]:
        """normalised-code hash → program id for a run: the duplicate index the loop keeps in memory."""
        with self.session() as s:
            rows = s.execute(select(Program.code_hash, Program.id).where(Program.run_id == run_id))
            return dict(rows.all())

    def group_rows(self, run_id: int, version_ids: Sequence[int], max_groups: int | None = None) -> GroupRows:
        """The newest `max_groups` groups sampled by the given policy versions, for training."""
        with self.session() as s:
            prompts = s.execute(
                select(Prompt.id, Prompt.text)
                .where(
                    Prompt.run_id == run_id,
                    Prompt.id.in_(
                        select(Completion.prompt_id).where(Completion.policy_version_id.in_(list(version_ids)))
                    ),
                )
                .order_by(Prompt.id.desc())
                .limit(max_groups)
            ).all()
            prompt_ids = [p.id for p in prompts]
            completions = (
                s.execute(select(Completion).where(Completion.prompt_id.in_(prompt_ids)).order_by(Completion.id))
                .scalars()
                .all()
            )
            answers = s.execute(
                select(Variant.completion_id, Variant.slot, Variant.status, Evaluation.scores, Evaluation.error_kind)
                .outerjoin(Evaluation, (Evaluation.program_id == Variant.program_id) & (Variant.status == "ok"))
                .where(Variant.completion_id.in_([c.id for c in completions]))
            ).all()
        return GroupRows([tuple(p) for p in prompts], list(completions), [tuple(a) for a in answers])  # type: ignore[misc]
