"""Read-side summaries for the CLI. These scan a run once per call; nothing here runs per iteration."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select

from evolve.archive.models import Completion, Evaluation, Program, Prompt, Run, Variant
from evolve.archive.store import Archive
from evolve.yields import run_yield


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
    yields: dict[str, float] = field(default_factory=dict)
    adaptations: list[dict[str, Any]] = field(default_factory=list)  # changes of the ask (evolve.adapt)


def _directions(run: Run) -> dict[str, float]:
    """+1/-1 per component from the run's config snapshot (maximize unless stated)."""
    from evolve.problem.config import FitnessSection

    fitness = FitnessSection.model_validate(run.config["problem"]["fitness"])
    return {c.name: c.sign for c in fitness.resolved()}


def summarize(archive: Archive, run: Run) -> RunSummary:
    out = RunSummary(run.id, run.problem_name, run.status, elapsed_s=float(run.state.get("elapsed_s", 0.0)))
    signs = _directions(run)
    with archive.session() as s:
        out.programs = s.scalar(select(func.count(Program.id)).where(Program.run_id == run.id)) or 0
        out.groups = s.scalar(select(func.count(Prompt.id)).where(Prompt.run_id == run.id)) or 0
        out.completions = s.scalar(select(func.count(Completion.id)).join(Prompt).where(Prompt.run_id == run.id)) or 0
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
                if held is None or signs.get(name, 1.0) * value > signs.get(name, 1.0) * held[1]:
                    out.best_components[name] = (pid, value)
        out.errors = dict(errors)
    out.policy_versions = [
        {"id": v.id, "number": v.number, "base_model": v.base_model, "adapter": v.adapter_path, "parent": v.parent_id}
        for v in archive.policy_versions(run.id)
    ]
    y = run_yield(archive, run.id)
    out.yields = {
        "new_valid": y.new_valid,
        "tokens": y.tokens,
        "per_completion": y.per_completion,
        "per_1k_tokens": y.per_1k_tokens,
        "unchanged": y.unchanged,
        "duplicate": y.duplicate,
        "unparseable": y.unparseable,
    }
    out.adaptations = list(run.state.get("adaptations", []))
    return out


def best_program(archive: Archive, run: Run, component: str | None = None) -> Program | None:
    """The best by scalar view, or by one component (in its own direction)."""
    if component is None:
        with archive.session() as s:
            q = (
                select(Program)
                .join(Evaluation)
                .where(Program.run_id == run.id, Evaluation.error_kind.is_(None))
                .order_by(Evaluation.scalar.desc(), Program.id)
                .limit(1)
            )
            return s.scalars(q).first()
    summary = summarize(archive, run)
    if component not in summary.best_components:
        return None
    return archive.program(summary.best_components[component][0])


def lineage(archive: Archive, program_id: int, limit: int = 50) -> list[Program]:
    chain = []
    current = archive.program(program_id)
    while current is not None and len(chain) < limit:
        chain.append(current)
        current = archive.program(current.parent_id) if current.parent_id else None
    return chain


def evaluation_rows(archive: Archive, run: Run) -> list[tuple[Program, Evaluation]]:
    with archive.session() as s:
        rows = s.execute(
            select(Program, Evaluation).join(Evaluation).where(Program.run_id == run.id).order_by(Program.id)
        )
        return [tuple(r) for r in rows]  # type: ignore[misc]
