"""Per ensemble member and per ask arm, what a run's groups cost and brought, read from the archive alone.

Each group records the member that sampled it and the ask arm it used (`Prompt.member`, `Prompt.ask`), so
`evolve inspect`, the reports and `evolve serve` show the allocation of any run, finished or running, without
the run's process: groups, share of all groups and of the most recent ones, tokens, new valid children and their
yield per 1k tokens, improvements over the parent, children that scored nothing, copies, and the best child.
Groups of archives older than ensembles name no member and are left out.

A child at the worst value of every component (`zero`, evolve.yields) is counted apart and never as valid or
improved, as the run's own yield counts it: an evaluator that swallows the candidate's exception scores a broken
child at 0, and a member whose children all score 0 must not look productive.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from evolve.archive.models import Completion, Evaluation, Program, Prompt, Variant
from evolve.yields import Scale

RECENT_GROUPS = 20  # the window of the "recent share": the current allocation
COPIES = ("unchanged", "duplicate")


def arm_rows(s: Session, run_id: int, kind: str, scale: Scale | None = None) -> list[dict[str, Any]]:
    """One row per member (`kind` "member") or per ask arm (`kind` "ask"), most groups first. `scale`: the
    components' directions and worst values, which decide a zero child (default: maximised, worst 0.0)."""
    column = Prompt.member if kind == "member" else Prompt.ask
    rows: dict[str, dict[str, Any]] = {}
    for name, groups, tokens in s.execute(
        select(column, func.count(Prompt.id), func.sum(Prompt.tokens))
        .where(Prompt.run_id == run_id, column.is_not(None))
        .group_by(column)
    ):
        rows[name] = _empty(kind, name, groups, int(tokens or 0))
    if not rows:
        return []
    for name, status, n in s.execute(
        select(column, Variant.status, func.count())
        .join(Completion, Completion.prompt_id == Prompt.id)
        .join(Variant, Variant.completion_id == Completion.id)
        .where(Prompt.run_id == run_id, column.is_not(None))
        .group_by(column, Variant.status)
    ):
        rows[name]["variants"][status] = n
    _children(s, run_id, column, rows, scale or Scale())
    recent = s.scalars(
        select(column)
        .where(Prompt.run_id == run_id, column.is_not(None))
        .order_by(Prompt.id.desc())
        .limit(RECENT_GROUPS)
    ).all()
    counts, total = Counter(recent), sum(r["groups"] for r in rows.values())
    for name, row in rows.items():
        row["share"] = row["groups"] / total
        row["recent_share"] = counts[name] / len(recent) if recent else 0.0
        row["copies"] = sum(row["variants"].get(c, 0) for c in COPIES)
        row["valid_per_1k_tokens"] = 1000.0 * row["valid"] / row["tokens"] if row["tokens"] else None
    return sorted(rows.values(), key=lambda r: (-r["groups"], r["name"]))


def _empty(kind: str, name: str, groups: int, tokens: int) -> dict[str, Any]:
    return {
        "kind": kind,
        "name": name,
        "groups": groups,
        "tokens": tokens,
        "variants": {},
        "valid": 0,
        "improved": 0,
        "zero": 0,
        "best_scalar": None,
        "best_id": None,
    }


def _children(s: Session, run_id: int, column: Any, rows: dict[str, dict[str, Any]], scale: Scale) -> None:
    """New children evaluated without error, by member or ask: those that scored nothing (zero), the valid rest,
    those better than their parent, the best."""
    parent = aliased(Program)
    parent_eval = aliased(Evaluation)
    q = (
        select(column, Program.id, Evaluation.scores, Evaluation.scalar, parent_eval.scalar)
        .select_from(Variant)
        .join(Program, Program.id == Variant.program_id)
        .join(Evaluation, Evaluation.program_id == Program.id)
        .join(Completion, Completion.id == Variant.completion_id)
        .join(Prompt, Prompt.id == Completion.prompt_id)
        .outerjoin(parent, parent.id == Program.parent_id)
        .outerjoin(parent_eval, parent_eval.program_id == parent.id)
        .where(
            Prompt.run_id == run_id,
            column.is_not(None),
            Variant.status == "ok",
            Evaluation.error_kind.is_(None),
        )
    )
    best: dict[str, tuple[float, int]] = {}
    improved: defaultdict[str, int] = defaultdict(int)
    for name, pid, scores, scalar, parent_scalar in s.execute(q):
        if scale.is_zero(scores or {}):
            rows[name]["zero"] += 1
            continue
        rows[name]["valid"] += 1
        if scalar is not None and parent_scalar is not None and scalar > parent_scalar:
            improved[name] += 1
        if scalar is not None and (name not in best or scalar > best[name][0]):
            best[name] = (scalar, pid)
    for name, row in rows.items():
        row["improved"] = improved[name]
        if name in best:
            row["best_scalar"], row["best_id"] = best[name]
