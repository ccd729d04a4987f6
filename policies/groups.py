"""Training groups from the archive: each prompt's G completions, each with its m answers' reward vectors.

Rewards are oriented (larger is better) and normalised per component to [0, 1] by the bounds the problem
declares, or else by the range observed among the answers of the batch being trained on (the recent groups,
so the cost of an update does not grow with the archive). Unparseable, failed and duplicate answers are zero
rows. Completions without token ids or logprobs (from some OpenAI-compatible servers) cannot be trained on
and are refused, counted under that reason.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import select

from evolve.archive import Archive
from evolve.archive.models import Completion, Evaluation, Prompt, Variant, unpack
from evolve.problem.config import ComponentSpec


@dataclass
class TrainingCompletion:
    completion_id: int
    token_ids: list[int]
    logprobs: list[float]
    temperature: float
    answers: np.ndarray  # (m, D) oriented raw scores; NaN rows for zero answers until normalised


@dataclass
class TrainingGroup:
    prompt_id: int
    prompt: str
    completions: list[TrainingCompletion]

    def rewards(self) -> np.ndarray:
        return np.stack([c.answers for c in self.completions])


@dataclass
class Batch:
    groups: list[TrainingGroup] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


def _oriented(components: Sequence[ComponentSpec], scores: dict[str, float]) -> np.ndarray:
    return np.array([c.sign * float(scores.get(c.name, c.failure)) for c in components])


def normalise(groups: list[TrainingGroup], components: Sequence[ComponentSpec]) -> None:
    """Map every answer row into [0, 1] per component in place; zero answers (NaN rows) become 0."""
    rows = np.concatenate([g.rewards().reshape(-1, len(components)) for g in groups]) if groups else np.zeros((0, 0))
    valid = rows[~np.isnan(rows).any(axis=1)] if rows.size else rows
    lo = np.array([min(c.sign * c.bounds[0], c.sign * c.bounds[1]) if c.bounds else np.nan for c in components])
    hi = np.array([max(c.sign * c.bounds[0], c.sign * c.bounds[1]) if c.bounds else np.nan for c in components])
    if len(valid):
        lo = np.where(np.isnan(lo), valid.min(axis=0), lo)
        hi = np.where(np.isnan(hi), valid.max(axis=0), hi)
    span = np.where(hi > lo, hi - lo, 1.0)
    for g in groups:
        for c in g.completions:
            unit = np.clip((c.answers - lo) / span, 0.0, 1.0)
            c.answers = np.nan_to_num(unit, nan=0.0)


def recent_version_ids(archive: Archive, run_id: int, versions_back: int) -> list[int]:
    versions = sorted(archive.policy_versions(run_id), key=lambda v: v.number)
    if not versions:
        return []
    newest = versions[-1].number
    return [v.id for v in versions if v.number >= newest - versions_back]


def load_batch(
    archive: Archive,
    run_id: int,
    components: Sequence[ComponentSpec],
    m: int,
    version_ids: Sequence[int],
    max_groups: int | None = None,
) -> Batch:
    """Groups of the given policy versions, newest first, normalised; skipped groups counted by reason."""
    batch = Batch()
    with archive.session() as s:
        prompts = s.execute(
            select(Prompt.id, Prompt.text)
            .where(
                Prompt.run_id == run_id,
                Prompt.id.in_(select(Completion.prompt_id).where(Completion.policy_version_id.in_(list(version_ids)))),
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
    by_completion: dict[int, np.ndarray] = {}
    for c in completions:
        by_completion[c.id] = np.full((m, len(components)), np.nan)
    for cid, slot, status, scores, error_kind in answers:
        if status == "ok" and scores is not None and error_kind is None and slot < m:
            by_completion[cid][slot] = _oriented(components, scores)
    grouped: dict[int, list[Completion]] = defaultdict(list)
    for c in completions:
        grouped[c.prompt_id].append(c)
    for prompt_id, text in prompts:
        trainable = []
        for c in grouped[prompt_id]:
            ids, lps = unpack(c.token_ids, "i"), unpack(c.logprobs, "f")
            if not ids or not lps or len(ids) != len(lps):
                batch.skipped["completion without token ids or logprobs"] += 1
                continue
            trainable.append(
                TrainingCompletion(c.id, ids, lps, float(c.sampling.get("temperature", 1.0)), by_completion[c.id])
            )
        if len(trainable) < 2:
            batch.skipped["fewer than 2 scored completions"] += 1
            continue
        batch.groups.append(TrainingGroup(prompt_id, text, trainable))
    normalise(batch.groups, components)
    return batch
