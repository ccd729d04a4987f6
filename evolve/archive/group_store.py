"""Groups: a prompt with its G completions and the variants parsed from them, written through Core in one
transaction (`inserts.py`); what is pending after a kill; the rows training reads back."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update

from evolve.archive.database import Database
from evolve.archive.inserts import CompletionRecord, GroupTelemetry, write_group
from evolve.archive.models import Completion, Evaluation, Prompt, Variant
from evolve.archive.packed import unpack
from evolve.archive.records import PendingVariant


@dataclass(frozen=True)
class StoredPrompt:
    """A group's prompt, with the scores of the parent it asked to improve (None: the parent has no evaluation
    without an error), which a reward for improvement measures each child against."""

    id: int
    text: str
    parent_id: int | None = None
    parent_scores: dict[str, float] | None = None


@dataclass(frozen=True)
class StoredCompletion:
    """A completion as training reads it: its token ids and logprobs packed as stored (`packed.py`), unpacked
    only for the completions training keeps."""

    id: int
    prompt_id: int
    token_ids: bytes | None
    logprobs: bytes | None
    temperature: float

    def token_id_list(self) -> list[int] | None:
        return unpack(self.token_ids, "i")

    def logprob_list(self) -> list[float] | None:
        return unpack(self.logprobs, "f")


@dataclass(frozen=True)
class StoredAnswer:
    """One answer slot of a completion: its status, and the scores of its program where it was evaluated."""

    completion_id: int
    slot: int
    status: str
    scores: dict[str, float] | None
    error_kind: str | None


@dataclass(frozen=True)
class GroupOutcome:
    """Which program a stored group asked to improve, how many completions it had and how many new programs its
    variants made (None in an archive older than parse counts)."""

    parent_id: int
    completions: int
    new_programs: int | None


@dataclass(frozen=True)
class GroupRows:
    """The rows of training groups: prompts newest first, their completions, and their answers."""

    prompts: list[StoredPrompt]
    completions: list[StoredCompletion]
    answers: list[StoredAnswer]


class GroupStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def add(
        self,
        run_id: int,
        *,
        parent_id: int,
        inspiration_ids: list[int],
        island: int,
        prompt: str,
        sampling: dict[str, Any],
        completions: Sequence[CompletionRecord],
        variants: Sequence[Sequence[tuple[str, str | None, int | None]]],
        telemetry: GroupTelemetry | None = None,
    ) -> list[list[int]]:
        """Store a prompt with its G completions and their parsed variants in one transaction; returns the
        variant ids. `variants[i]` lists (status, detail, program_id) for completion i, in slot order."""
        with self.db.engine.begin() as conn:
            return write_group(
                conn,
                run_id,
                parent_id=parent_id,
                inspiration_ids=inspiration_ids,
                island=island,
                prompt=prompt,
                sampling=sampling,
                completions=completions,
                variants=variants,
                telemetry=telemetry or GroupTelemetry(),
            )

    def set_variant(self, variant_id: int, **values: Any) -> None:
        with self.db.session() as s:
            s.execute(update(Variant).where(Variant.id == variant_id).values(**values))

    def pending_variants(self, run_id: int) -> list[PendingVariant]:
        """Variants parsed as new children whose evaluation never landed (the run was killed)."""
        q = (
            select(Variant.id, Variant.slot, Prompt.parent_id, Completion.text, Prompt.island)
            .add_columns(Prompt.member, Prompt.ask)
            .join(Completion, Completion.id == Variant.completion_id)
            .join(Prompt, Prompt.id == Completion.prompt_id)
            .where(Prompt.run_id == run_id, Variant.status == "ok", Variant.program_id.is_(None))
        )
        with self.db.session() as s:
            return [PendingVariant(*r) for r in s.execute(q)]

    def count(self, run_id: int) -> int:
        with self.db.session() as s:
            return s.scalar(select(func.count(Prompt.id)).where(Prompt.run_id == run_id)) or 0

    def outcomes(self, run_id: int) -> list[GroupOutcome]:
        """Every group of a run in the order it was stored: what selection replays its parents' spent streaks from."""
        with self.db.session() as s:
            rows = s.execute(
                select(Prompt.parent_id, Prompt.parse_counts, func.count(Completion.id))
                .outerjoin(Completion, Completion.prompt_id == Prompt.id)
                .where(Prompt.run_id == run_id)
                .group_by(Prompt.id)
                .order_by(Prompt.id)
            ).all()
        return [GroupOutcome(p, n, None if c is None else int(c.get("ok", 0))) for p, c, n in rows]

    def rows_for_training(self, run_id: int, version_ids: Sequence[int], max_groups: int | None = None) -> GroupRows:
        """The newest `max_groups` groups sampled by the given policy versions, for training."""
        with self.db.session() as s:
            prompts = s.execute(
                select(Prompt.id, Prompt.text, Prompt.parent_id, Evaluation.scores, Evaluation.error_kind)
                .outerjoin(Evaluation, Evaluation.program_id == Prompt.parent_id)
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
        return GroupRows(
            [StoredPrompt(p.id, p.text, p.parent_id, None if p.error_kind else p.scores) for p in prompts],
            [
                StoredCompletion(
                    c.id, c.prompt_id, c.token_ids, c.logprobs, float((c.sampling or {}).get("temperature", 1.0))
                )
                for c in completions
            ],
            [StoredAnswer(*a) for a in answers],
        )
