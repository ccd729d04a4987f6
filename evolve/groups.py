"""The group sampler: one group, start to stored. Pick a parent and inspirations, build the prompt, sample G
completions, parse them into variants and store the group; the new children come back in a `GroupResult`.

Each step is named, so that an unexpected exception in it becomes a `StageFailure` that costs this group only;
the loop records it as an incident and goes on. A group cut short by Ctrl-C (or a reached goal) is never stored.

Parsing runs on a worker thread, and Ctrl-C must not wait for it: each completion's parse is bounded (its size
and its CPU time, evolve/prompts/parse_limits.py), no single step of it holds the GIL for long, and the run's
interrupt flag is asked at every check of the deadline, so a group being parsed is dropped at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from evolve.adapt import Ask
from evolve.archive import Archive, CompletionRecord, GroupTelemetry, code_hash
from evolve.archive.models import utcnow
from evolve.archive.records import VariantRow
from evolve.children import Child, GroupCost, GroupResult, KnownCode
from evolve.control import Incidents, StageFailure
from evolve.ensemble import estimated_tokens
from evolve.fitness import raw_scores
from evolve.policy_calls import PolicyMember
from evolve.problem import Problem
from evolve.prompts import (
    ParsedVariant,
    ParseInterrupted,
    PromptInputs,
    build_prompt,
    completion_budget,
    completion_stop,
    parse_completion,
    resolve_edit_format,
)
from evolve.runs import RunOptions
from evolve.selection import Member, Population, Selector
from evolve.stats import LoopStats
from policies.base import Generated, SamplingParams

RECENT_FAILURES = 3  # failed children of the parent listed in its prompt
RECENT_CHILDREN = 2  # newest children of the parent shown in its prompt, so that variants differ from them


@dataclass(frozen=True)
class Prompted:
    """A group's prompt with what it was made of: the codes shown (by program id) and the edit format asked."""

    codes: dict[int, str]
    edit_format: str  # resolved for this parent: diff | full
    text: str


@dataclass(frozen=True)
class NewVariant:
    """A variant that parsed into code not seen before: the child it will become once the group is stored."""

    completion: int  # index of its completion in the group
    slot: int
    code: str
    digest: str


@dataclass(frozen=True)
class ParsedGroup:
    """A sampled group as the archive stores it, and its new children."""

    completions: list[CompletionRecord]
    variants: list[list[VariantRow]]  # by completion, in slot order
    new: list[NewVariant]


def parse_texts(
    parent_code: str, texts: list[str], m: int, stop: Callable[[], bool] | None = None
) -> list[list[tuple[ParsedVariant, str | None]]]:
    """Each completion's variants with the normalised hash of each parsed child: the group's CPU-heavy part,
    pure so that it runs off the event loop (on a worker thread). `stop` (the run's interrupt flag) ends it with
    `ParseInterrupted` within one check of the parser's deadline."""
    out = []
    for text in texts:
        variants = parse_completion(parent_code, text, m, stop=stop)
        out.append([(v, None if v.code is None else code_hash(v.code)) for v in variants])
    return out


class GroupSampler:
    """Makes groups from the population for one run; shares the code index with the commit stage."""

    def __init__(
        self,
        problem: Problem,
        archive: Archive,
        run_id: int,
        options: RunOptions,
        population: Population,
        selector: Selector,
        stats: LoopStats,
        known: KnownCode,
        incidents: Incidents,
        interrupted: Callable[[], bool] | None = None,
    ) -> None:
        """`interrupted`: whether Ctrl-C or SIGTERM came (asked from the parsing thread); a parse it stops drops
        the group being parsed."""
        self.problem, self.archive, self.run_id, self.options = problem, archive, run_id, options
        self.population, self.selector, self.stats, self.known = population, selector, stats, known
        self.incidents, self.interrupted = incidents, interrupted
        # Children claimed by a group that is still being stored or queued: they count as pending work, so that
        # groups finished meanwhile (whose copies of them are duplicates) do not count towards a stall.
        self.unqueued = 0
        self.all_queued = asyncio.Event()
        self.all_queued.set()

    def queued(self, children: int) -> None:
        """The generator put a group's children on the evaluation queue (or the group failed to store them)."""
        self.unqueued -= children
        if self.unqueued == 0:
            self.all_queued.set()

    async def make_group(self, index: int, member: PolicyMember, ask: Ask, arm: str = "base") -> GroupResult | None:
        """Prompt, sample, parse and store group `index`, sampled by `member` as `ask` (ask arm `arm`, recorded
        with the group); None when the sampling was cut short (nothing of the group is stored). Raises
        `StageFailure` naming the step that failed."""
        stage, parsed = "prompt", None
        try:
            rng = np.random.default_rng([self.options.seed, index])
            island = index % len(self.population.islands)
            parent, inspirations = self.pick(rng, island)
            prompted = await asyncio.to_thread(self.prompt, parent, inspirations, ask)
            self.incidents.ok(stage)
            stage = "sample"
            params = self._params(rng, ask, prompted.codes[parent.id], prompted.edit_format)
            version_id = member.versions.serving()
            started, clock = utcnow(), time.monotonic()
            group = await member.calls.sample(prompted.text, params, self.options.group_size)
            if group is None or any(g.finish_reason == "interrupted" for g in group):
                return None
            generation_s = time.monotonic() - clock
            self.incidents.ok(stage)
            stage = "parse"
            texts = [g.text for g in group]
            parent_code = prompted.codes[parent.id]
            variants = await asyncio.to_thread(parse_texts, parent_code, texts, self.options.variants, self.interrupted)
            parsed = self._parse_group(member, group, variants, version_id)
            counts = Counter(row.status for rows in parsed.variants for row in rows)
            known = [len(g.token_ids) for g in group if g.token_ids is not None]
            telemetry = GroupTelemetry(
                sum(known) if known else None, generation_s, started, dict(counts), member.name, arm
            )
            self.incidents.ok(stage)
            stage = "store"
            variant_ids = await asyncio.to_thread(
                self.archive.add_group,
                self.run_id,
                parent_id=parent.id,
                inspiration_ids=[i.id for i in inspirations],
                island=island,
                prompt=prompted.text,
                sampling={**params.as_dict(), "edit_format": prompted.edit_format, "template": ask.template},
                completions=parsed.completions,
                variants=parsed.variants,
                telemetry=telemetry,
            )
            self.incidents.ok(stage)
        except asyncio.CancelledError:
            raise
        except ParseInterrupted:
            return None  # Ctrl-C while parsing: the group is dropped, as one cut short while sampling is
        except Exception as exc:
            if stage == "store" and parsed is not None:  # these children were never stored: forget their hashes
                self.known.forget(v.digest for v in parsed.new)
                self.queued(len(parsed.new))
            raise StageFailure(stage, exc) from exc
        children = [
            Child(
                v.code,
                parent.id,
                island,
                parent.generation + 1,
                variant_ids[v.completion][v.slot],
                v.digest,
                member.name,
                arm,
                parent.scalar,
            )
            for v in parsed.new
        ]
        counted = [None if g.token_ids is None else len(g.token_ids) for g in group]
        spent = GroupCost(len(group), estimated_tokens(texts, counted), generation_s)
        return GroupResult(index, parent, island, children, counts, member.name, arm, spent)

    def pick(self, rng: np.random.Generator, island_index: int) -> tuple[Member, list[Member]]:
        """A parent from the island, and the inspirations shown beside it (its island's best first)."""
        island = self.population.islands[island_index]
        if not island.pool():
            if self.population.first is None:
                raise LookupError("no program has scored yet: the seed failed its evaluation (see `evolve show`)")
            return self.population.first, []
        parent = self.selector.pick(island, rng)
        others = [m for m in island.pool() if m.id != parent.id]
        k = min(self.problem.config.search.inspirations, len(others))
        elite = [m for m in island.best(1) if m.id != parent.id][:k]
        rest = [m for m in others if m not in elite]
        extra = [rest[int(i)] for i in rng.choice(len(rest), size=min(k - len(elite), len(rest)), replace=False)]
        return parent, elite + extra

    def prompt(self, parent: Member, inspirations: list[Member], ask: Ask) -> Prompted:
        """The prompt for a parent: the group's archive reads and its prompt, done together (on a worker thread,
        by `make_group`) so that the event loop goes on meanwhile."""
        codes = self.archive.codes([parent.id, *(i.id for i in inspirations)])
        edit_format = resolve_edit_format(ask.edit_format, codes[parent.id])
        context = self.archive.parent_context(parent.id)
        text = build_prompt(
            PromptInputs(
                self.problem.config.description,
                codes[parent.id],
                self._scores_of(parent),
                context.feedback,
                [(codes[i.id], self._scores_of(i)) for i in inspirations],
                self.options.variants,
                edit_format,
                parent_stderr=context.stderr,
                parent_case_errors=context.case_errors,
                recent_failures=self.archive.recent_child_failures(parent.id, RECENT_FAILURES),
                recent=self.archive.recent_children(parent.id, RECENT_CHILDREN),
                template=ask.template,
                language=self.problem.config.program.language,
                program_view=self.problem.config.program.prompt_view,
            )
        )
        return Prompted(codes, edit_format, text)

    def resumed_children(self) -> Iterator[Child]:
        """On resume: the stored variants whose evaluations never landed, parsed again. A variant whose code is
        known meanwhile is marked a duplicate (or its parse status) instead; an unreadable one is an incident.
        Ctrl-C ends the resume at its next parse check: the variants not reached stay pending."""
        for pending in self.archive.pending_variants(self.run_id):
            try:
                parent = self.archive.program(pending.parent_id)
                if parent is None:
                    raise LookupError(f"parent {pending.parent_id} of variant {pending.variant_id} is missing")
                parsed = parse_completion(
                    parent.code, pending.completion_text, self.options.variants, stop=self.interrupted
                )
                slot = parsed[pending.slot] if pending.slot < len(parsed) else None
                scalar = parent.evaluation.scalar if parent.evaluation is not None else None
                code = slot.code if slot is not None else None
                digest = code_hash(code) if code is not None else ""
                if code is None or digest in self.known:
                    status = "duplicate" if code else (slot.status if slot is not None else "parse_error")
                    self.archive.set_variant(pending.variant_id, status=status)
                    continue
            except ParseInterrupted:
                return
            except Exception as exc:  # one unreadable pending variant must not stop the resume
                self.incidents.record(StageFailure("parse", exc))
                continue
            self.known.claim([digest])
            yield Child(
                code,
                pending.parent_id,
                pending.island,
                parent.generation + 1,
                pending.variant_id,
                digest,
                pending.member or "",
                pending.ask or "",
                scalar,
            )

    def _scores_of(self, m: Member) -> dict[str, float]:
        return raw_scores(self.problem.components, m.oriented)

    def _params(self, rng: np.random.Generator, ask: Ask, parent_code: str, edit_format: str) -> SamplingParams:
        budget = self.options.max_new_tokens
        if self.options.fit_tokens_to_code:
            budget = completion_budget(parent_code, self.options.variants, edit_format, budget)
        return SamplingParams(
            ask.temperature,
            ask.top_p,
            budget,
            int(rng.integers(2**31)),
            stop=completion_stop(self.options.variants),
        )

    def _parse_group(
        self,
        member: PolicyMember,
        group: list[Generated],
        parsed: list[list[tuple[ParsedVariant, str | None]]],
        version_id: int,
    ) -> ParsedGroup:
        """Each completion's record and its variants' rows; a variant whose code is already known is a duplicate.
        The new children's hashes join the index only when the whole group parsed."""
        records, rows, new = [], [], []
        fresh: dict[str, None] = {}
        for gen, variants in zip(group, parsed, strict=True):
            self.stats.tokens += len(gen.token_ids or ())
            self.stats.completions += 1
            row_id = member.versions.row_of(gen.version, version_id)
            records.append(CompletionRecord(gen.text, gen.token_ids, gen.logprobs, gen.finish_reason, row_id))
            row = []
            for v, digest in variants:
                status, pid = v.status, None
                if v.code is not None and digest is not None:
                    if digest in self.known or digest in fresh:
                        status, pid = "duplicate", self.known.program(digest)
                    else:
                        fresh[digest] = None
                        new.append(NewVariant(len(records) - 1, v.slot, v.code, digest))
                self.stats.parse[status] += 1
                row.append(VariantRow(status, v.detail, pid))
            rows.append(row)
        self.known.claim(fresh)
        if new:
            self.unqueued += len(new)
            self.all_queued.clear()
        return ParsedGroup(records, rows, new)
