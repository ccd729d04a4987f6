"""One group, start to stored: pick a parent and inspirations, build the prompt, sample G completions, parse
them into variants and commit the group. A mixin of `SearchLoop` (kept apart to keep each module small).

Each step is named, so that an unexpected exception in it becomes a `StageFailure` that costs this group
only; the loop records it as an incident and goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import numpy as np

from evolve.archive import Archive, CompletionRecord, GroupTelemetry, code_hash
from evolve.archive.models import Run, utcnow
from evolve.fitness import raw_scores
from evolve.problem import Problem
from evolve.prompts import ParsedVariant, PromptInputs, build_prompt, parse_completion
from evolve.runs import RunOptions
from evolve.selection import Member, Population, Selector
from evolve.stats import LoopStats
from policies.base import AsyncPolicy, Generated, Policy, SamplingParams

RECENT_FAILURES = 3  # failed children of the parent listed in its prompt


def parse_texts(parent_code: str, texts: list[str], m: int) -> list[list[tuple[ParsedVariant, str | None]]]:
    """Each completion's variants with the normalised hash of each parsed child: the group's CPU-heavy part,
    pure so that it runs off the event loop (on a worker thread)."""
    return [
        [(v, None if v.code is None else code_hash(v.code)) for v in parse_completion(parent_code, text, m)]
        for text in texts
    ]


class StageFailure(Exception):
    """An unexpected exception at one stage of one group or child; it costs that group or child only."""

    def __init__(self, stage: str, exc: BaseException) -> None:
        super().__init__(f"{stage}: {type(exc).__name__}: {exc}")
        self.stage, self.exc = stage, exc


class GroupMaker:
    """The generation side of `SearchLoop`: everything from choosing a parent to a stored group."""

    problem: Problem
    archive: Archive
    policy: Policy
    run: Run
    options: RunOptions
    population: Population
    selector: Selector
    stats: LoopStats
    hashes: dict[str, int | None]
    _version_rows: dict[int, int]

    def _ensure_version_row(self) -> int: ...  # provided by SearchLoop

    def _stage_ok(self, stage: str) -> None: ...  # provided by SearchLoop

    def _scores_of(self, m: Member) -> dict[str, float]:
        return raw_scores(self.problem.components, m.oriented)

    def _pick(self, rng: np.random.Generator, island_index: int) -> tuple[Member, list[Member]]:
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

    async def _one_group(self, index: int) -> tuple[list[tuple[str, str, int]], Member, int]:
        """Prompt, sample, parse and store one group; returns ((code, digest, variant id) of each child, parent,
        island)."""
        stage, children = "prompt", []
        try:
            rng = np.random.default_rng([self.options.seed, index])
            island = index % len(self.population.islands)
            parent, inspirations = self._pick(rng, island)
            codes, prompt = await asyncio.to_thread(self._prompt, parent, inspirations)
            self._stage_ok(stage)
            stage = "sample"
            params = SamplingParams(
                self.options.temperature, self.options.top_p, self.options.max_new_tokens, int(rng.integers(2**31))
            )
            version_id = self._ensure_version_row()
            started, clock = utcnow(), time.monotonic()
            group = await self._sample(prompt, params)
            generation_s = time.monotonic() - clock
            self._stage_ok(stage)
            stage = "parse"
            texts = [g.text for g in group]
            parsed = await asyncio.to_thread(parse_texts, codes[parent.id], texts, self.options.variants)
            records, statuses, children = self._parse_group(group, parsed, version_id)
            counts = Counter(st for row in statuses for st, _d, _p in row)
            known = [len(g.token_ids) for g in group if g.token_ids is not None]
            telemetry = GroupTelemetry(sum(known) if known else None, generation_s, started, dict(counts))
            self._stage_ok(stage)
            stage = "store"
            variant_ids = await asyncio.to_thread(
                self.archive.add_group,
                self.run.id,
                parent_id=parent.id,
                inspiration_ids=[i.id for i in inspirations],
                island=island,
                prompt=prompt,
                sampling=params.as_dict(),
                completions=records,
                variants=statuses,
                telemetry=telemetry,
            )
            self._stage_ok(stage)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if stage == "store":  # these children were never stored: forget their hashes
                for _i, _slot, _code, digest in children:
                    self.hashes.pop(digest, None)
            raise StageFailure(stage, exc) from exc
        return [(code, digest, variant_ids[i][slot]) for i, slot, code, digest in children], parent, island

    def _prompt(self, parent: Member, inspirations: list[Member]) -> tuple[dict[int, str], str]:
        """The codes of the parent and inspirations (by id) and the prompt made of them: the group's archive
        reads and its prompt, done together on a worker thread so that the event loop goes on meanwhile."""
        codes = self.archive.codes([parent.id, *(i.id for i in inspirations)])
        context = self.archive.parent_context(parent.id)
        return codes, build_prompt(
            PromptInputs(
                self.problem.config.description,
                codes[parent.id],
                self._scores_of(parent),
                context.feedback,
                [(codes[i.id], self._scores_of(i)) for i in inspirations],
                self.options.variants,
                self.options.edit_format,
                parent_stderr=context.stderr,
                parent_case_errors=context.case_errors,
                recent_failures=self.archive.recent_child_failures(parent.id, RECENT_FAILURES),
            )
        )

    async def _sample(self, prompt: str, params: SamplingParams) -> list[Generated]:
        if isinstance(self.policy, AsyncPolicy):  # HTTP policies: many groups in flight at once
            return await self.policy.agenerate(prompt, params, self.options.group_size)
        return await asyncio.to_thread(self.policy.generate, prompt, params, self.options.group_size)

    def _parse_group(
        self, group: list[Generated], parsed: list[list[tuple[ParsedVariant, str | None]]], version_id: int
    ) -> tuple[list[CompletionRecord], list[list[tuple[str, str | None, int | None]]], list[tuple[int, int, str, str]]]:
        """Each completion's record, its variants' (status, detail, program id) by slot, and the new children
        as (completion index, slot, code, digest). A variant whose code is already known is a duplicate. The new
        children's hashes join the index only when the whole group parsed."""
        records, statuses, children = [], [], []
        fresh: dict[str, None] = {}
        for gen, variants in zip(group, parsed, strict=True):
            self.stats.tokens += len(gen.token_ids or ())
            row_id = self._version_rows.get(gen.version, version_id)
            records.append(CompletionRecord(gen.text, gen.token_ids, gen.logprobs, gen.finish_reason, row_id))
            row = []
            for v, digest in variants:
                status, pid = v.status, None
                if v.code is not None and digest is not None:
                    if digest in self.hashes or digest in fresh:
                        status, pid = "duplicate", self.hashes.get(digest)
                    else:
                        fresh[digest] = None
                        children.append((len(records) - 1, v.slot, v.code, digest))
                self.stats.parse[status] += 1
                row.append((status, v.detail, pid))
            statuses.append(row)
        self.hashes.update(fresh)
        return records, statuses, children
