"""A run's summary: counts, errors, best per component and scalar, incidents, telemetry and yield, in one pass.

The archive knows no problem model: which way is better for each component comes in as a value (`signs`, as
`evolve.fitness.signs` gives them), and so does each component's worst value (`worst`, as
`evolve.yields.worst_values` gives them), so a stored run's summary needs no problem folder and no config parsing
here. It scans a run once per call; nothing here runs per iteration.

What the children brought (beating their parent, zero, same behaviour, new bests: `evolve.yields.QualityTally`)
is read from the stored evaluations and parent links alone, in program id order (the order the loop committed
them in), so an archive written before these figures existed gives them too, with no column added.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from evolve.archive.arms import arm_rows
from evolve.archive.clock import utcnow
from evolve.archive.models import Completion, Evaluation, Incident, Program, Prompt, Variant
from evolve.archive.records import PolicyVersionRecord, RunRecord
from evolve.yields import QualityCounts, QualityTally, Scale, Yield


@dataclass
class RunSummary:
    run_id: int
    problem: str
    status: str
    programs: int = 0
    evaluations: int = 0
    groups: int = 0
    completions: int = 0
    cut: int = 0  # completions that stopped at their token budget (finish reason "length")
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
    quality: QualityCounts = field(default_factory=QualityCounts)  # what the children brought
    adaptations: list[dict[str, Any]] = field(default_factory=list)  # changes of the ask (archives before issue 24)
    members: list[dict[str, Any]] = field(default_factory=list)  # per ensemble member: groups, share, yield (arms.py)
    asks: list[dict[str, Any]] = field(default_factory=list)  # the same per ask arm
    bandit: dict[str, Any] = field(default_factory=dict)  # the allocator's record as the run keeps it (its state)


def summary_yield(s: RunSummary) -> Yield:
    """The run's yield from its summary's counts: completions, tokens, valid children, variant statuses, and what
    the children brought."""
    tokens, valid = s.telemetry.get("tokens"), s.telemetry.get("valid_children")
    return Yield(s.completions, int(tokens or 0), int(valid or 0), s.variants, cut=s.cut, quality=s.quality)


HEARTBEAT_STALE_S = 60.0  # a `running` run not heard from for this long was killed


def shown_status(run: RunRecord, now: datetime | None = None) -> str:
    """`running`, unless its heartbeat (saved every few seconds) stopped: then it was killed, `interrupted`."""
    if run.status != "running":
        return run.status
    age = ((now or utcnow()) - run.updated_at).total_seconds()
    return "interrupted" if age > HEARTBEAT_STALE_S else "running"


def summarize(
    s: Session,
    run: RunRecord,
    signs: Mapping[str, float],
    versions: Sequence[PolicyVersionRecord],
    worst: Mapping[str, float] | None = None,
) -> RunSummary:
    """`signs`: +1 for a component to maximise, -1 for one to minimise; a component not named is maximised.
    `worst`: each component's worst value (`evolve.yields.worst_values`); without it, 0.0 for each component the
    scores name (see `evolve.yields.Scale`)."""
    state = run.state
    out = RunSummary(
        run.id,
        run.problem_name,
        shown_status(run),
        elapsed_s=state.elapsed_s,
        stop_reason=state.stop_reason,
        interruptions=state.interruptions,
        options=dict(run.config.get("options", {})),
        overrides=list(run.config.get("overrides", [])),
        adaptations=list(state.adaptations),
        bandit=dict(state.ensemble),
    )
    out.programs = s.scalar(select(func.count(Program.id)).where(Program.run_id == run.id)) or 0
    out.groups = s.scalar(select(func.count(Prompt.id)).where(Prompt.run_id == run.id)) or 0
    completions = s.execute(
        select(func.count(Completion.id), func.count(Completion.id).filter(Completion.finish_reason == "length"))
        .join(Prompt)
        .where(Prompt.run_id == run.id)
    ).one()
    out.completions, out.cut = completions[0] or 0, completions[1] or 0
    rows = s.execute(
        select(Variant.status, func.count())
        .join(Completion)
        .join(Prompt)
        .where(Prompt.run_id == run.id)
        .group_by(Variant.status)
    )
    out.variants = dict(rows.all())
    out.islands = dict(
        s.execute(select(Program.island, func.count()).where(Program.run_id == run.id).group_by(Program.island)).all()
    )
    errors: Counter[str] = Counter()
    scale = Scale(signs, worst or {})  # zero children and who beat their parent: the tally's and the arms' rule
    tally = QualityTally(scale)
    valid_children = 0
    for pid, parent_id, scores, scalar, kind in s.execute(
        select(Evaluation.program_id, Program.parent_id, Evaluation.scores, Evaluation.scalar, Evaluation.error_kind)
        .join(Program)
        .where(Program.run_id == run.id)
        .order_by(Program.id)
    ):
        out.evaluations += 1
        if parent_id is None:
            tally.known(pid, scores, scalar, not kind)
        else:
            valid_children += tally.child(pid, parent_id, scores, scalar, not kind).valid
        if kind:
            errors[kind] += 1
            continue
        if out.best_scalar is None or scalar > out.best_scalar[1]:
            out.best_scalar = (pid, scalar)
        for name, value in scores.items():
            held = out.best_components.get(name)
            sign = signs.get(name, 1.0)
            if held is None or sign * value > sign * held[1]:
                out.best_components[name] = (pid, value)
    out.errors = dict(errors)
    out.quality = tally.counts
    _incidents_and_telemetry(s, run, out, valid_children)
    out.members, out.asks = arm_rows(s, run.id, "member", scale), arm_rows(s, run.id, "ask", scale)
    out.policy_versions = [
        {
            "id": v.id,
            "number": v.number,
            "base_model": v.base_model,
            "adapter": v.adapter_path,
            "parent": v.parent_id,
            "member": v.member,
        }
        for v in versions
    ]
    return out


def _incidents_and_telemetry(s: Session, run: RunRecord, out: RunSummary, valid_children: int) -> None:
    """`valid_children`: children evaluated without error that are not zero (`evolve.yields.ChildVerdict`)."""
    incidents = s.execute(
        select(Incident.stage, Incident.kind, func.count())
        .where(Incident.run_id == run.id)
        .group_by(Incident.stage, Incident.kind)
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
    builds, build_s_mean = s.execute(
        select(func.count(Evaluation.build_s), func.avg(Evaluation.build_s))
        .join(Program)
        .where(Program.run_id == run.id, Evaluation.build_s.is_not(None))
    ).one()
    minutes = out.elapsed_s / 60.0
    out.telemetry = {
        "tokens": tokens,
        "generation_s": gen_s,
        "tokens_per_s": tokens / gen_s if tokens and gen_s else None,
        "evaluations_per_min": out.evaluations / minutes if minutes > 0 else None,
        "valid_children": valid_children,
        "valid_children_per_1k_tokens": 1000.0 * valid_children / tokens if tokens else None,
        "builds": builds,  # evaluations that ran a [build] command (programs of another language)
        "build_s_mean": build_s_mean,  # their mean build seconds; None when none built
    }
    out.yields = summary_yield(out).as_dict()
