"""One group, start to stored: pick a parent and inspirations, build the prompt, sample G completions, parse
them into variants and commit the group; then count it towards a stall and let the adapter change the ask. A
mixin of `SearchLoop` (kept apart to keep each module small).

Each step is named, so that an unexpected exception in it becomes a `StageFailure` that costs this group
only; the loop records it as an incident and goes on. A group cut short by Ctrl-C is never committed.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from evolve.adapt import Adapter, Ask
from evolve.archive import Archive, CompletionRecord, GroupTelemetry, code_hash
from evolve.archive.models import Run, utcnow
from evolve.fitness import raw_scores
from evolve.interrupt import cancel_on, until_interrupted
from evolve.problem import Problem
from evolve.prompts import (
    ParsedVariant,
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
from evolve.stopping import Stall
from policies.base import AsyncPolicy, Generated, Interruptible, Policy, SamplingParams

RECENT_FAILURES = 3  # failed children of the parent listed in its prompt
RECENT_CHILDREN = 2  # newest children of the parent shown in its prompt, so that variants differ from them


@dataclass
class Child:
    """A new program parsed out of one variant slot, waiting for (or under) evaluation."""

    code: str
    parent_id: int | None
    island: int
    generation: int
    variant_id: int | None
    digest: str  # its normalised-code hash, computed once when it was parsed


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
    interrupted: asyncio.Event  # Ctrl-C: a generation in flight is abandoned
    sampling_cut: asyncio.Event  # Ctrl-C or the target reached: no group in flight is stored
    sampling = 0  # policy calls in flight
    stall: Stall
    adapter: Adapter
    children: asyncio.Queue[Child]
    no_more_groups: bool
    groups_started: int
    reserved: int
    finished_reason: str

    def _ensure_version_row(self) -> int: ...  # provided by SearchLoop

    def _stage_ok(self, stage: str) -> None: ...  # provided by SearchLoop

    def _finish(self, reason: str) -> None: ...  # provided by SearchLoop

    def _pending_work(self) -> int: ...  # provided by SearchLoop

    def _save_state(self) -> None: ...  # provided by SearchLoop

    def _budget_left(self) -> bool: ...  # provided by SearchLoop

    def _incident(self, failure: StageFailure) -> None: ...  # provided by SearchLoop

    def _scores_of(self, m: Member) -> dict[str, float]:
        return raw_scores(self.problem.components, m.oriented)

    async def _requeue_pending(self) -> None:
        """On resume: the stored variants whose evaluations never landed are parsed again and queued."""
        for variant_id, slot, parent_id, text, island in self.archive.pending_variants(self.run.id):
            try:
                parent = self.archive.program(parent_id)
                if parent is None:
                    raise LookupError(f"parent {parent_id} of variant {variant_id} is missing")
                parsed = parse_completion(parent.code, text, self.options.variants)
                code = parsed[slot].code if slot < len(parsed) else None
                digest = code_hash(code) if code is not None else ""
                if code is None or digest in self.hashes:
                    status = "duplicate" if code else (parsed[slot].status if slot < len(parsed) else "parse_error")
                    self.archive.set_variant(variant_id, status=status)
                    continue
            except Exception as exc:  # one unreadable pending variant must not stop the resume
                self._incident(StageFailure("parse", exc))
                continue
            self.hashes[digest] = None
            await self.children.put(Child(code, parent_id, island, parent.generation + 1, variant_id, digest))

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

    async def _one_group(self, index: int) -> tuple[list[tuple[str, str, int]], Member, int, Counter[str]] | None:
        """Prompt, sample, parse and store one group; returns ((code, digest, variant id) of each child, parent,
        island, variant statuses), or None when Ctrl-C cut the sampling short (nothing of the group is stored)."""
        stage, children = "prompt", []
        try:
            rng = np.random.default_rng([self.options.seed, index])
            island = index % len(self.population.islands)
            parent, inspirations = self._pick(rng, island)
            ask = self.adapter.ask  # read on the loop: the adapter changes only here, between groups
            codes, edit_format, prompt = await asyncio.to_thread(self._prompt, parent, inspirations, ask)
            self._stage_ok(stage)
            stage = "sample"
            ceiling = self.options.max_new_tokens
            budget = ceiling
            if self.options.fit_tokens_to_code:
                budget = completion_budget(codes[parent.id], self.options.variants, edit_format, ceiling)
            params = SamplingParams(
                ask.temperature,
                self.options.top_p,
                budget,
                int(rng.integers(2**31)),
                stop=completion_stop(self.options.variants),
            )
            version_id = self._ensure_version_row()
            started, clock = utcnow(), time.monotonic()
            group = await self._sample(prompt, params)
            if group is None or any(g.finish_reason == "interrupted" for g in group):
                return None
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
                sampling={**params.as_dict(), "edit_format": edit_format, "template": ask.template},
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
        return [(code, digest, variant_ids[i][slot]) for i, slot, code, digest in children], parent, island, counts

    def _prompt(self, parent: Member, inspirations: list[Member], ask: Ask) -> tuple[dict[int, str], str, str]:
        """The codes of the parent and inspirations (by id), the edit format resolved for this parent, and the
        prompt made of them: the group's archive reads and its prompt, done together on a worker thread so that
        the event loop goes on meanwhile."""
        codes = self.archive.codes([parent.id, *(i.id for i in inspirations)])
        edit_format = resolve_edit_format(ask.edit_format, codes[parent.id])
        context = self.archive.parent_context(parent.id)
        return codes, edit_format, build_prompt(
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
            )
        )

    def cut_sampling(self) -> None:
        """The goal is reached (`--target`, or every component at its best bound): end the groups being sampled
        (they are not stored) instead of waiting minutes for children past the goal; queued ones are still scored."""
        self.sampling_cut.set()
        self.interrupt_sampling()

    async def watch_time_budget(self) -> None:
        """`--max-time`: once the run's time is spent, stop it and cut the group being sampled, as Ctrl-C does (the
        group is not stored) rather than letting a minutes-long group overrun the limit; queued children are
        still scored, as on any budget stop."""
        limit = self.options.max_time_s
        if limit is None:
            return
        while (left := limit - self.stats.elapsed_s) > 0:
            await asyncio.sleep(min(left, 1.0))
        self._finish("time budget reached")
        self.cut_sampling()

    def interrupt_sampling(self) -> None:
        """Tell an in-process policy to stop between tokens, only while a call is in flight (a request that found
        none would end the policy's next, unrelated call); HTTP calls are cancelled through `sampling_cut`."""
        if self.sampling and isinstance(self.policy, Interruptible) and not isinstance(self.policy, AsyncPolicy):
            self.policy.interrupt()

    async def _sample(self, prompt: str, params: SamplingParams) -> list[Generated] | None:
        """The group's completions; None when Ctrl-C came first (the call is abandoned, not waited for) or the
        target was reached (an HTTP call is cancelled; an in-process one ends at its next token)."""
        g = self.options.group_size
        if self.sampling_cut.is_set():
            return None
        self.sampling += 1
        try:
            if isinstance(self.policy, AsyncPolicy):  # HTTP policies: many groups in flight at once
                return await cancel_on(self.sampling_cut, self.policy.agenerate(prompt, params, g))
            try:
                group = await until_interrupted(self.interrupted, self.policy.generate, prompt, params, g)
            except Exception:
                self._withdraw_unseen_interrupt(None)
                raise
            if group is not None:  # None: abandoned on Ctrl-C; the policy's thread consumes the request itself
                self._withdraw_unseen_interrupt(group)
            return group
        finally:
            self.sampling -= 1

    def _withdraw_unseen_interrupt(self, group: list[Generated] | None) -> None:
        """A call that came back (or raised) after the cut without honouring it had ended before it looked: the
        request it was sent is still set and would end the policy's next, unrelated call, so withdraw it. The
        cut is the only sender during a call: `interrupt_sampling` runs only once `sampling_cut` is set."""
        if not self.sampling_cut.is_set() or not isinstance(self.policy, Interruptible):
            return
        if not (group and any(c.finish_reason == "interrupted" for c in group)):
            self.policy.withdraw_interrupt()

    def finish_generating(self) -> None:
        """Start no further group; what is generated still gets evaluated (fixed-time benchmark runs)."""
        self.no_more_groups = True

    def _may_generate(self) -> bool:
        """Budget left for another group: time, evaluations, and the group budget where one is set."""
        if self.no_more_groups:
            return False
        if self.options.max_groups is not None and self.groups_started >= self.options.max_groups:
            self.finished_reason = self.finished_reason or "group budget reached"
            return False
        return self._budget_left() and self.reserved + self.children.qsize() < self.options.max_evaluations

    def _note_group(self, index: int, produced: bool, statuses: Counter[str]) -> None:
        """Count the group towards a stall; every few barren ones change the ask (recorded with the run at
        once); a stalled run stops with one line saying what was tried and what to change."""
        self.stats.groups += 1
        if self.stall.observe(produced, bool(self._pending_work()), statuses):
            change = self.adapter.after_barren(index, self.stall)
            if change is not None:
                self.stats.adaptations += 1
                self.stats.last_adaptation = f"group {index}: {change['change']} ({change['why']})"
                self._save_state()
        self.stats.ask = self.adapter.ask.describe()
        if self.stall.stalled:
            self._finish(self.stall.message(self.adapter.tried(), self.adapter.ask.describe()))

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
            self.stats.completions += 1
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
