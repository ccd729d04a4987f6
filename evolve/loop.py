"""The search loop: select → prompt → sample a group → parse → evaluate → commit, with the stages overlapped.

One generator task feeds a bounded queue of children; N evaluation workers drain it through the sandbox;
a single committer writes each result as it lands (program and evaluation in one transaction) and updates
the in-memory population. Every prompt, completion and parsed variant is committed before its children are
evaluated, so a run killed at any moment resumes by re-parsing the variants whose evaluations never landed.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from evolve.adapt import Adapter, Ask, RecentChildren
from evolve.archive import Archive, CompletionRecord, code_hash
from evolve.archive.models import Run
from evolve.archive.store import code_hashes
from evolve.fitness import scalar_view
from evolve.interrupt import until_interrupted
from evolve.problem import Problem
from evolve.prompts import PromptInputs, build_prompt, parse_completion, resolve_edit_format
from evolve.runs import RunOptions
from evolve.selection import Member, Population, make_selector
from evolve.stats import LoopStats
from policies.base import Policy, SamplingParams
from sandboxes.base import ErrorKind, EvalOutcome, Sandbox
from sandboxes.runner import failed

STORED_OUTPUT = 8 * 1024


@dataclass
class Child:
    code: str
    parent_id: int | None
    island: int
    generation: int
    variant_id: int | None


class SearchLoop:
    def __init__(
        self,
        problem: Problem,
        archive: Archive,
        policy: Policy,
        sandbox: Sandbox,
        run: Run,
        options: RunOptions,
        train_step: Callable[[], Any] | None = None,
    ) -> None:
        self.problem, self.archive, self.policy, self.sandbox = problem, archive, policy, sandbox
        self.run, self.options = run, options
        search = problem.config.search
        self.population = Population(
            problem.components,
            islands=search.islands,
            features=search.features,
            migration_interval=search.migration_interval,
            migration_size=search.migration_size,
        )
        self.selector = make_selector(search.selection, len(problem.components))
        self.stats = LoopStats(
            problem.component_names,
            options.max_evaluations,
            options.max_time_s,
            prior_elapsed_s=float(run.state.get("elapsed_s", 0.0)),
            sandbox=sandbox.kind,
        )
        self.hashes: dict[str, int | None] = {}
        self.children: asyncio.Queue[Child] = asyncio.Queue(maxsize=max(2 * options.workers, 4))
        self.results: asyncio.Queue[tuple[Child, EvalOutcome]] = asyncio.Queue()
        self.stop = asyncio.Event()
        self.interrupted = asyncio.Event()  # Ctrl-C: also abandons a generation in flight
        self.no_more_groups = False
        self.reserved = 0  # evaluations committed plus those in flight
        self.finished_reason = ""
        self.fatal: Exception | None = None
        initial = Ask(options.edit_format, options.temperature, options.template)
        self.adapter = Adapter.restore(initial, run.state, every=options.adapt_every, stall=options.stall_groups)
        self.recent = RecentChildren()
        self.train_step = train_step
        self.groups_since_train = 0
        self.groups_started = 0
        self._versions: dict[int, int] = {}

    # ---- start-up ---------------------------------------------------------------------------------------
    def _rebuild(self) -> None:
        """Replay the archive into the in-memory index (one pass, at start only)."""
        for row in self.archive.scored_programs(self.run.id):
            ok = row.error_kind is None and row.scalar is not None
            member = self.population.member(
                row.id, row.island, row.generation, row.scores, row.scalar or 0.0, row.code_length
            )
            self.population.add(member if ok else None)
            self._count(member, row.error_kind)
        self.hashes = dict(code_hashes(self.archive, self.run.id))
        self.stats.groups = self.groups_started = self.archive.count_groups(self.run.id)
        self.reserved = self.stats.evaluations

    def _count(self, member: Member, error_kind: str | None) -> None:
        self.stats.evaluations += 1
        if error_kind is None:
            oriented = {c.name: float(v) for c, v in zip(self.problem.components, member.oriented, strict=True)}
            self.stats.record_best(member.id, member.scalar, oriented)
        self.stats.island_sizes = [isl.size for isl in self.population.islands]

    def _version_id(self) -> int:
        number = self.policy.version
        if number not in self._versions:
            known = {v.number: v.id for v in self.archive.policy_versions(self.run.id)}
            self._versions.update(known)
            if number not in self._versions:
                self._versions[number] = self.archive.add_policy_version(
                    run_id=self.run.id, base_model=self.policy.name, number=number
                )
        self.stats.policy_version = number
        return self._versions[number]

    async def _requeue_pending(self) -> None:
        for variant_id, slot, parent_id, text, island in self.archive.pending_variants(self.run.id):
            parent = self.archive.program(parent_id)
            assert parent is not None
            parsed = parse_completion(parent.code, text, self.options.variants)
            code = parsed[slot].code if slot < len(parsed) else None
            if code is None or code_hash(code) in self.hashes:
                self.archive.set_variant(variant_id, status="duplicate" if code else "parse_error")
                continue
            self.hashes[code_hash(code)] = None
            await self.children.put(Child(code, parent_id, island, parent.generation + 1, variant_id))

    # ---- stages -----------------------------------------------------------------------------------------
    def _budget_left(self) -> bool:
        if self.stop.is_set():
            return False
        if self.options.max_time_s is not None and self.stats.elapsed_s >= self.options.max_time_s:
            self.finished_reason = self.finished_reason or "time budget reached"
            return False
        return self.reserved < self.options.max_evaluations

    def finish_generating(self) -> None:
        """Start no further group; what is generated still gets evaluated (for fixed-size benchmark runs)."""
        self.no_more_groups = True

    def _may_generate(self) -> bool:
        """Budget left for another group (the evaluation budget, and the group budget where one is set)."""
        if self.no_more_groups:
            return False
        if self.options.max_groups is not None and self.groups_started >= self.options.max_groups:
            self.finished_reason = self.finished_reason or "group budget reached"
            return False
        return self._budget_left() and self.reserved + self.children.qsize() < self.options.max_evaluations

    def _pick(self, rng: np.random.Generator, island_index: int) -> tuple[Member, list[Member]]:
        island = self.population.islands[island_index]
        if not island.pool():
            assert self.population.first is not None
            return self.population.first, []
        parent = self.selector.pick(island, rng)
        others = [m for m in island.pool() if m.id != parent.id]
        k = min(self.problem.config.search.inspirations, len(others))
        elite = [m for m in island.best(1) if m.id != parent.id][:k]
        rest = [m for m in others if m not in elite]
        extra = [rest[int(i)] for i in rng.choice(len(rest), size=min(k - len(elite), len(rest)), replace=False)]
        return parent, elite + extra

    def _scores_of(self, m: Member) -> dict[str, float]:
        return {c.name: c.sign * float(v) for c, v in zip(self.problem.components, m.oriented, strict=True)}

    async def generate(self) -> None:
        m, g = self.options.variants, self.options.group_size
        while self._may_generate():
            index, self.groups_started = self.groups_started, self.groups_started + 1
            rng = np.random.default_rng([self.options.seed, index])
            island = index % len(self.population.islands)
            parent, inspirations = self._pick(rng, island)
            codes = self.archive.codes([parent.id, *(i.id for i in inspirations)])
            ask = self.adapter.ask
            edit_format = resolve_edit_format(ask.edit_format, codes[parent.id])
            prompt = build_prompt(
                PromptInputs(
                    self.problem.config.description,
                    codes[parent.id],
                    self._scores_of(parent),
                    self.archive.feedback(parent.id),
                    [(codes[i.id], self._scores_of(i)) for i in inspirations],
                    m,
                    edit_format,
                    self.recent.of(parent.id),
                    ask.template,
                )
            )
            params = SamplingParams(ask.temperature, 0.95, self.options.max_new_tokens, int(rng.integers(2**31)))
            version_id = self._version_id()
            agenerate = getattr(self.policy, "agenerate", None)
            if agenerate is not None:  # HTTP policies: many groups in flight at once
                group = await agenerate(prompt, params, g)
            else:
                group = await until_interrupted(self.interrupted, self.policy.generate, prompt, params, g)
            if group is None or any(gen.finish_reason == "interrupted" for gen in group):
                return  # cut short by Ctrl-C: a half-made group is never committed
            records, statuses, children = [], [], []
            for gen in group:
                self.stats.tokens += len(gen.token_ids or ())
                records.append(
                    CompletionRecord(
                        gen.text,
                        gen.token_ids,
                        gen.logprobs,
                        gen.finish_reason,
                        self._versions.get(gen.version, version_id),
                    )
                )
                row = []
                for v in parse_completion(codes[parent.id], gen.text, m):
                    status, pid = v.status, None
                    if v.code is not None:
                        digest = code_hash(v.code)
                        if digest in self.hashes:
                            status, pid = "duplicate", self.hashes[digest]
                        else:
                            self.hashes[digest] = None
                            children.append((len(records) - 1, v.slot, v.code))
                    self.stats.parse[status] += 1
                    row.append((status, v.detail, pid))
                statuses.append(row)
            ids = await asyncio.to_thread(
                self.archive.add_group,
                self.run.id,
                parent_id=parent.id,
                inspiration_ids=[i.id for i in inspirations],
                island=island,
                prompt=prompt,
                sampling={**params.as_dict(), "edit_format": edit_format, "template": ask.template},
                completions=records,
                variants=statuses,
            )
            self.stats.groups += 1
            self.stats.completions += len(records)
            self._adapt(index, parent.id, children, statuses)
            for i, slot, code in children:
                await self.children.put(Child(code, parent.id, island, parent.generation + 1, ids[i][slot]))
            self.groups_since_train += 1
            if self.train_step is not None and self.groups_since_train >= self.options.train_every:
                await self._train()

    def _adapt(self, index: int, parent_id: int, children: list[tuple[int, int, str]], statuses: list) -> None:
        """Remember what this parent produced; change the ask after barren groups; stop a stalled run."""
        for _, _, code in children:
            self.recent.add(parent_id, code)
        counts = Counter(status for row in statuses for status, _, _ in row)
        change = self.adapter.after_group(index, len(children), counts)
        if change is not None:
            self.stats.adaptations += 1
            self.stats.last_adaptation = f"group {index}: {change['change']} ({change['why']})"
            self._save_state()  # the change is in the archive at once, not at the next 5 s tick
        self.stats.ask = self.adapter.ask.describe()
        if self.adapter.stalled:
            self.finished_reason = self.adapter.stall_message()
            self.stop.set()

    async def _train(self) -> None:
        """Pause generation, let the recent groups' evaluations land, update and publish the policy."""
        await self.children.join()
        await self.results.join()
        self.groups_since_train = 0
        try:
            stats = await asyncio.to_thread(self.train_step)  # type: ignore[arg-type]
            self.stats.train_updates += 1
            self.stats.last_train = f"v{self.policy.version}: {stats.samples} samples, loss {stats.loss:.4g}"
        except Exception as exc:  # a failed update never stops the run; the old version keeps serving
            self.stats.train_failures += 1
            self.stats.last_train = f"update failed ({type(exc).__name__}: {exc}); serving v{self.policy.version}"
        self._version_id()

    async def evaluate(self) -> None:
        while True:
            child = await self.children.get()
            if not self._budget_left():
                self.children.task_done()
                continue  # left pending in the archive; a resumed run with more budget evaluates it
            self.reserved += 1
            try:
                outcome = await asyncio.to_thread(self.sandbox.evaluate, self.problem, child.code)
            except Exception as exc:  # a sandbox bug must cost one evaluation, not the run
                outcome = failed(self.problem, ErrorKind.CRASH, f"sandbox failure: {exc!r}", 0.0, self.sandbox.kind)
            await self.results.put((child, outcome))
            self.children.task_done()

    async def commit(self) -> None:
        while True:
            child, outcome = await self.results.get()
            try:
                await asyncio.to_thread(self._commit_one, child, outcome)
            except Exception as exc:  # the archive is gone or broken: stop, keeping what was committed
                self.fatal = exc
                self.stop.set()
            finally:
                self.results.task_done()

    def _commit_one(self, child: Child, outcome: EvalOutcome) -> None:
        scalar = scalar_view(self.problem.components, outcome.scores)
        pid, created = self.archive.add_evaluated_program(
            self.run.id,
            child.code,
            parent_id=child.parent_id,
            island=child.island,
            generation=child.generation,
            variant_id=child.variant_id,
            evaluation=dict(
                scores=outcome.scores,
                scalar=scalar,
                error_kind=outcome.error_kind,
                error=outcome.error,
                duration_s=outcome.duration_s,
                feedback=outcome.feedback,
                stdout=outcome.stdout[:STORED_OUTPUT],
                stderr=outcome.stderr[:STORED_OUTPUT],
                sandbox=outcome.sandbox,
            ),
        )
        self.hashes[code_hash(child.code)] = pid
        if not created:
            self.reserved -= 1
            return
        member = self.population.member(pid, child.island, child.generation, outcome.scores, scalar, len(child.code))
        self.population.add(member if outcome.ok else None)
        self.stats.session_evaluations += 1
        if outcome.ok and child.variant_id is not None:
            self.stats.new_valid += 1
        self._count(member, outcome.error_kind)
        if outcome.error_kind:
            self.stats.errors[outcome.error_kind] += 1
        target = self.options.target
        if target is not None and self.stats.best_scalar is not None and self.stats.best_scalar >= target:
            self.finished_reason = f"target {target} reached"
            self.stop.set()
        if self.stats.evaluations >= self.options.max_evaluations:
            self.finished_reason = self.finished_reason or "evaluation budget reached"

    # ---- the whole run ----------------------------------------------------------------------------------
    async def run_async(self) -> str:
        self._rebuild()
        if self.stats.evaluations == 0:
            self.hashes[code_hash(self.problem.seed_code)] = None
            self.reserved += 1
            outcome = await asyncio.to_thread(self.sandbox.evaluate, self.problem, self.problem.seed_code)
            await asyncio.to_thread(self._commit_one, Child(self.problem.seed_code, None, 0, 0, None), outcome)
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, self._interrupt)
        workers = [asyncio.create_task(self.evaluate()) for _ in range(self.options.workers)]
        committer = asyncio.create_task(self.commit())
        ticker = asyncio.create_task(self._save_elapsed())
        try:
            await self._requeue_pending()  # after the workers start: the queue is bounded
            while self._may_generate() and self.fatal is None:
                # Training pauses generation, so it needs a single generator; HTTP policies take several.
                parallel = 1 if self.train_step else max(1, min(self.policy.max_concurrency, 8))
                await asyncio.gather(*(self.generate() for _ in range(parallel)))
                await self._settle()
        finally:
            for task in (*workers, committer, ticker):
                task.cancel()
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)
            self._save_state()
        if self.fatal is not None:
            self.archive.update_run(self.run.id, status="failed")
            raise self.fatal
        if not self.finished_reason:
            self.finished_reason = "evaluation budget reached"
        status = "stopped" if self.finished_reason == "interrupted" else "finished"
        self.archive.update_run(self.run.id, status=status)
        return self.finished_reason

    async def _settle(self) -> None:
        """Wait until every queued child is evaluated (or left pending on stop) and every result committed.

        Ctrl-C cuts the wait short: evaluations in flight are abandoned, their variants stay pending in the
        archive, and the same command evaluates them on resume.
        """

        async def drained() -> None:
            await self.children.join()
            await self.results.join()

        waiting = asyncio.ensure_future(drained())
        stopper = asyncio.ensure_future(self.interrupted.wait())
        try:
            await asyncio.wait({waiting, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
            stopper.cancel()

    def _interrupt(self) -> None:
        if self.stop.is_set() and self.finished_reason == "interrupted":
            raise KeyboardInterrupt
        self.finished_reason = "interrupted"
        self.stop.set()
        self.interrupted.set()
        interrupt = getattr(self.policy, "interrupt", None)
        if interrupt is not None:  # cut the generation in flight short (between two tokens)
            interrupt()

    async def _save_elapsed(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            await asyncio.to_thread(self._save_state)

    def _save_state(self) -> None:
        state: dict[str, Any] = {**self.run.state, **self.adapter.state(), "elapsed_s": self.stats.elapsed_s}
        self.archive.update_run(self.run.id, state=state)


def run_search(loop: SearchLoop) -> str:
    return asyncio.run(loop.run_async())
