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
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np

from evolve.archive import Archive, CompletionRecord, GroupTelemetry, code_hash
from evolve.archive.clock import utcnow
from evolve.archive.records import PendingVariant
from evolve.ask_arms import Ask
from evolve.control import StageFailure
from evolve.ensemble import estimated_tokens
from evolve.filetree import file_spans
from evolve.fitness import raw_scores, signs
from evolve.handoffs import Admitted, Child, GroupCost, GroupResult, HashedVariant
from evolve.options import RunOptions
from evolve.policy_calls import PolicyMember
from evolve.problem import Problem
from evolve.problem.blocks import has_markers
from evolve.problem.fixed_code import interface_calls
from evolve.problem.outcome import SwallowedError
from evolve.prompts import (
    Composed,
    ParseInterrupted,
    PromptInputs,
    ShownProgram,
    compose,
    parse_completion,
    resolve_edit_format,
    safe_blocks,
)
from evolve.selection import PoolView, RankedProgram, Selector, pick_parent
from evolve.yields import Scale, worst_values
from policies.answer_grammar import LINE_COMMENTS, AnswerShape
from policies.policy import Generated, Policy, SamplingParams, StructuredSampling

RECENT_FAILURES = 3  # failed children of the parent listed in its prompt (refused ones too: zero_child_feedback)
GUARDED_CHILDREN = 16  # the parent's newest children its answer is guarded from copying (shown or not)


@dataclass(frozen=True)
class Prompted:
    """A group's prompt with what it was made of: the codes shown (by program id), what it asks (`Composed`: the
    text, the edit format resolved for the parent, the fences' tag and the answer's bounds), and the shape its
    answer is held to while sampled (None: free text), which the text asks for (`answer_shape`)."""

    codes: dict[int, str]
    asked: Composed
    shape: AnswerShape | None = None
    avoid: tuple[str, ...] = ()  # the editable blocks the answer should not copy (`copy_guard_codes`)

    @property
    def text(self) -> str:
        return self.asked.text

    @property
    def edit_format(self) -> str:
        return self.asked.edit_format


@dataclass(frozen=True)
class SampledGroup:
    """A group sampled and parsed, not yet stored: what the loop admits (duplicates marked by the run's ledger)
    before `GroupSampler.store` writes it."""

    index: int
    parent: RankedProgram
    inspirations: list[RankedProgram]
    island: int
    prompted: Prompted
    params: SamplingParams
    version_id: int  # the serving version's row: completions of an unknown version point to it
    version: int  # and its number
    generated: list[Generated]
    parsed: list[list[HashedVariant]]  # each completion's variants with their code hashes
    generation_s: float
    started: datetime
    tokens: list[int]  # each completion's token count (0 where the policy counts none)
    cut: int  # completions that stopped at their token budget rather than at their end


@dataclass(frozen=True)
class ResumedVariant:
    """A variant stored by an earlier session whose child was never evaluated, parsed again: its code (None when it
    no longer parses: `status` says why) and what its child inherits."""

    pending: PendingVariant
    code: str | None
    status: str
    generation: int
    parent_scalar: float | None


def parse_texts(
    parent_code: str, texts: list[str], m: int, stop: Callable[[], bool] | None = None, multi_file: bool = False
) -> list[list[HashedVariant]]:
    """Each completion's variants with the normalised hash of each parsed child: the group's CPU-heavy part,
    pure so that it runs off the event loop (on a worker thread). `stop` (the run's interrupt flag) ends it with
    `ParseInterrupted` within one check of the parser's deadline. `multi_file`: the problem's, never the text's."""
    out = []
    for text in texts:
        variants = parse_completion(parent_code, text, m, multi_file=multi_file, stop=stop)
        out.append([HashedVariant(v, None if v.code is None else code_hash(v.code, multi_file)) for v in variants])
    return out


class GroupSampler:
    """Makes one group at a time for a run: reads the archive, calls the policy, writes the group. It holds no run
    state: the pool it picks from comes with each call as a detached view (`PoolView`), and what happened goes back
    as records."""

    def __init__(
        self,
        problem: Problem,
        archive: Archive,
        run_id: int,
        options: RunOptions,
        selector: Selector,
        interrupted: Callable[[], bool] | None = None,
    ) -> None:
        """`interrupted`: whether Ctrl-C or SIGTERM came (asked from the parsing thread; the run's read-only
        `StopSignals.interrupt_requested`, which leads back to nothing it could change); a parse it stops drops
        the group being parsed."""
        self.problem, self.archive, self.run_id, self.options = problem, archive, run_id, options
        self.selector, self.interrupted = selector, interrupted
        self.zero = Scale(signs(problem.components), worst_values(problem.components))  # which children scored nothing
        self.seed_interface = interface_calls(problem.seed_code)  # the same for every prompt of the run
        self.seed_calls: list[str] | None = None  # and its first calls, as the seed's evaluation recorded them

    async def sample(self, index: int, member: PolicyMember, ask: Ask, pool: PoolView) -> SampledGroup | None:
        """Pick a parent from `pool` (its island's programs, `RunLedger.parent_pool`), prompt, sample and parse
        group `index` as `member` asks it; None when the sampling was cut short (nothing of it is kept). Raises
        `StageFailure` naming the step that failed."""
        stage = "prompt"
        try:
            rng = np.random.default_rng([self.options.seed, index])
            island = pool.island.index
            chosen = pick_parent(pool, self.selector, rng, self.problem.config.search.inspirations)
            parent, inspirations = chosen.parent, chosen.inspirations
            prompted = await asyncio.to_thread(self.prompt, parent, inspirations, ask, structured_by(member.policy))
            stage = "sample"
            params = self._params(rng, ask, prompted)
            version_id, version = member.versions.serving(), member.policy.version
            started, clock = utcnow(), time.monotonic()
            group = await member.calls.sample(prompted.text, params, self.options.group_size)
            if group is None or any(g.finish_reason == "interrupted" for g in group):
                return None
            generation_s = time.monotonic() - clock
            stage = "parse"
            texts = [g.text for g in group]
            parent_code = prompted.codes[parent.id]
            variants = await asyncio.to_thread(
                parse_texts, parent_code, texts, self.options.variants, self.interrupted, self.problem.multi_file
            )
        except asyncio.CancelledError:
            raise
        except ParseInterrupted:
            return None  # Ctrl-C while parsing: the group is dropped, as one cut short while sampling is
        except Exception as exc:
            raise StageFailure(stage, exc) from exc
        tokens = [len(g.token_ids or ()) for g in group]
        return SampledGroup(
            index,
            parent,
            inspirations,
            island,
            prompted,
            params,
            version_id,
            version,
            group,
            variants,
            generation_s,
            started,
            tokens,
            sum(g.finish_reason == "length" for g in group),
        )

    async def store(
        self, sampled: SampledGroup, admitted: Admitted, member: PolicyMember, ask: Ask, arm: str
    ) -> GroupResult:
        """Write the group (prompt, completions, variants as admitted) in one transaction; its new children come
        back in the `GroupResult`. Raises `StageFailure("store", ...)`."""
        group, parent = sampled.generated, sampled.parent
        records = [
            CompletionRecord(
                g.text, g.token_ids, g.logprobs, g.finish_reason, member.versions.row_of(g.version, sampled.version_id)
            )
            for g in group
        ]
        counts = Counter(row.status for rows in admitted.variants for row in rows)
        known = [n for g, n in zip(group, sampled.tokens, strict=True) if g.token_ids is not None]
        telemetry = GroupTelemetry(
            sum(known) if known else None, sampled.generation_s, sampled.started, dict(counts), member.name, arm
        )
        try:
            variant_ids = await asyncio.to_thread(
                self.archive.add_group,
                self.run_id,
                parent_id=parent.id,
                inspiration_ids=[i.id for i in sampled.inspirations],
                island=sampled.island,
                prompt=sampled.prompted.text,
                sampling={
                    **sampled.params.as_dict(),
                    "edit_format": sampled.prompted.edit_format,
                    "template": ask.template,
                },
                completions=records,
                variants=admitted.variants,
                telemetry=telemetry,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise StageFailure("store", exc) from exc
        children = [
            Child(
                code=v.code,
                parent_id=parent.id,
                island=sampled.island,
                generation=parent.generation + 1,
                variant_id=variant_ids[v.completion][v.slot],
                digest=v.digest,
                member=member.name,
                ask=arm,
                parent_scalar=parent.scalar,
            )
            for v in admitted.new
        ]
        texts = [g.text for g in group]
        counted = [None if g.token_ids is None else len(g.token_ids) for g in group]
        spent = GroupCost(len(group), estimated_tokens(texts, counted), sampled.generation_s)
        return GroupResult(
            sampled.index, parent, sampled.island, children, counts, member.name, arm, spent, sampled.version
        )

    def prompt(
        self, parent: RankedProgram, inspirations: list[RankedProgram], ask: Ask, held: tuple[str, ...] = ()
    ) -> Prompted:
        """The prompt for a parent: the group's archive reads and its prompt, done together (on a worker thread,
        by `sample`) so that the event loop goes on meanwhile. `held`: the edit formats whose answers the policy
        holds to their shape (`structured_by`); the shape is decided here, so that the prompt asks for its lead
        comment exactly when the grammar holds it."""
        shown = self.options.recent_children
        if self.seed_calls is None and self.options.interface_reminder:  # the seed is scored before any group
            self.seed_calls = self.archive.seed_first_calls(self.run_id)
        may_guard = self.options.copy_guard and self.options.structured != "off" and bool(held)  # answer_shape's
        zero = self.zero if self.options.zero_child_feedback else None  # refused children among the failures
        reads = self.archive.prompt_reads(
            parent.id,
            [i.id for i in inspirations],
            RECENT_FAILURES,
            max(shown, GUARDED_CHILDREN if may_guard else 0),
            zero,
        )
        codes, context, children = reads.codes, reads.context, reads.recent  # children: oldest first
        edit_format = resolve_edit_format(ask.edit_format, codes[parent.id])
        inputs = PromptInputs(
            self.problem.config.description,
            codes[parent.id],
            self._scores_of(parent),
            context.feedback,
            [ShownProgram(codes[i.id], self._scores_of(i)) for i in inspirations],
            self.options.variants,
            ask.edit_format,
            parent_stderr=context.stderr,
            parent_case_errors=context.case_errors,
            parent_swallowed=[SwallowedError.from_dict(e) for e in context.swallowed or ()],
            recent_failures=reads.recent_failures,
            recent=children[max(0, len(children) - shown) :] if shown else [],
            template=ask.template,
            language=self.problem.config.program.language,
            program_view=self.problem.config.program.prompt_view,
            others_view=self.options.others_view,
            fixed_code=self.options.fixed_code,
            interface=self.seed_interface if self.options.interface_reminder else (),
            interface_examples=self.seed_calls or (),
            multi_file=self.problem.multi_file,
        )
        shape = answer_shape(self.options, edit_format, inputs.fence_tag, codes[parent.id], held, inputs.multi_file)
        inputs = replace(
            inputs,
            lead_comment=shape.lead_comment if shape is not None else "",
            line_comment=LINE_COMMENTS.get(inputs.fence_tag, "#"),
        )
        composed = compose(inputs, self.options.max_new_tokens, self.options.fit_tokens_to_code, shape is not None)
        guarded = self.options.copy_guard and shape is not None
        avoid = copy_guard_codes([*codes.values(), *children]) if guarded else ()
        return Prompted(codes, composed, shape, avoid)

    def resumed(self) -> Iterator[ResumedVariant | StageFailure]:
        """On resume: the stored variants whose evaluations never landed, parsed again (an unreadable one comes as
        the `StageFailure` it cost). Ctrl-C ends the resume at its next parse check: the variants not reached stay
        pending."""
        for pending in self.archive.pending_variants(self.run_id):
            try:
                parent = self.archive.program(pending.parent_id)
                if parent is None:
                    raise LookupError(f"parent {pending.parent_id} of variant {pending.variant_id} is missing")
                parsed = parse_completion(
                    parent.code,
                    pending.completion_text,
                    self.options.variants,
                    multi_file=self.problem.multi_file,
                    stop=self.interrupted,
                )
            except ParseInterrupted:
                return
            except Exception as exc:  # one unreadable pending variant must not stop the resume
                yield StageFailure("parse", exc)
                continue
            slot = parsed[pending.slot] if pending.slot < len(parsed) else None
            scalar = parent.evaluation.scalar if parent.evaluation is not None else None
            code, status = (slot.code, slot.status) if slot is not None else (None, "parse_error")
            yield ResumedVariant(pending, code, status, parent.generation + 1, scalar)

    def mark(self, resumed: ResumedVariant, status: str) -> None:
        """A resumed variant that makes no child (a duplicate now, or no longer parsing): its status is stored."""
        self.archive.set_variant(resumed.pending.variant_id, status=status)

    def _scores_of(self, m: RankedProgram) -> dict[str, float]:
        return raw_scores(self.problem.components, m.oriented)

    def _params(self, rng: np.random.Generator, ask: Ask, prompted: Prompted) -> SamplingParams:
        """The group's sampling: its ask, the answer's bounds (a token budget fitted to the parent, stop strings),
        and the answer's shape its prompt was made for (`answer_shape`)."""
        asked = prompted.asked
        return SamplingParams(
            ask.temperature,
            ask.top_p,
            asked.max_new_tokens,
            int(rng.integers(2**31)),
            stop=asked.stop,
            structured=prompted.shape,
            avoid=prompted.avoid,
        )


def answer_shape(
    options: RunOptions,
    edit_format: str,
    fence: str,
    parent_code: str,
    held: tuple[str, ...],
    multi_file: bool = False,
) -> AnswerShape | None:
    """The shape a group's answer is held to while sampled, the one place that decides it: with `--structured` on
    or auto, for a policy that holds answers in this (resolved) edit format (`held`); else None (free text). A
    parent of several files names the files a header may name: those with EVOLVE blocks, the only ones a variant
    may change (a header naming another made the variant `parse_error` or `outside_block`). Its lead comment
    (`# Change: ...`, issue 37) where `--lead-comment` is on, the format is `full` and the fence's language has a
    known line comment (none for a bare fence or another tag); the prompt asks for exactly this lead
    (`PromptInputs.lead_comment`). `multi_file`: the problem's programs are of several files (`Problem.multi_file`;
    never told from the parent's text)."""
    if options.structured == "off" or edit_format not in held:
        return None
    tree = multi_file
    files = editable_files(parent_code) if tree else ()
    if tree and not files:  # no file with blocks: what a variant may name is not the grammar's to say
        return None
    lead = LINE_COMMENTS.get(fence, "") if options.lead_comment and edit_format == "full" else ""
    try:
        return AnswerShape(options.variants, edit_format, fence, lead, files)
    except ValueError:  # a path no header can name (a space in it): that program's answers are read free
        return None


def editable_files(code: str) -> tuple[str, ...]:
    """The paths of a program of several files that hold EVOLVE blocks, in the program's order."""
    return tuple(path for path, start, end in file_spans(code) if has_markers(code[start:end]))


def copy_guard_codes(programs: list[str]) -> tuple[str, ...]:
    """The editable blocks of `programs` (the parent, the programs its prompt shows, its newest children), each
    once: what a fenced block of an answer would be if it copied one (`policies/copy_guard.py`), in a program of
    several files too (its blocks, each fenced under its file's header)."""
    blocks = (b.text.strip("\n") for code in programs for b in safe_blocks(code))
    return tuple(dict.fromkeys(b for b in blocks if b.strip()))


def structured_by(policy: Policy) -> tuple[str, ...]:
    """The edit formats whose answers `policy` holds to their shape while sampling (none: free text only)."""
    return policy.structured_formats if isinstance(policy, StructuredSampling) else ()
