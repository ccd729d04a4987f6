"""The search loop: select → prompt → sample a group → parse → evaluate → commit, with the stages overlapped.

One generator task feeds a bounded queue of children; N evaluation workers drain it through the sandbox;
a single committer writes each result as it lands (program and evaluation in one transaction) and updates
the in-memory population. Every prompt, completion and parsed variant is committed before its children are
evaluated, so a run killed at any moment resumes by re-parsing the variants whose evaluations never landed.

Nothing a model, a candidate or an evaluator produces ends a run: an unexpected exception while building a
prompt, sampling, parsing, storing, evaluating or committing costs that group or that child, is recorded as an
incident in the archive, and the run goes on; only the same failure `max_failures` times in a row stops it.
When a run ends by a budget, a target, a stall or patience, the children already queued are evaluated first.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from evolve.archive import Archive, code_hash
from evolve.archive.batch import NewProgram, add_evaluated_programs
from evolve.archive.models import Run, utcnow
from evolve.fitness import oriented_by_name, scalar_view, signs
from evolve.groups import GroupMaker, StageFailure
from evolve.problem import Problem
from evolve.prompts import parse_completion
from evolve.runs import RunOptions
from evolve.selection import Member, Population, make_selector
from evolve.stats import LoopStats
from evolve.stopping import FailureStreaks, Patience, solved
from policies.base import Policy
from sandboxes.base import AsyncSandbox, ErrorKind, EvalOutcome, Sandbox

STORED_OUTPUT = 8 * 1024
MAX_BARREN_GROUPS = 50
COMMIT_BATCH = 64  # results written in one transaction at most
ENGINE_THREADS = 12  # worker threads beside evaluations: generators (8 at most), the committer, the state saver


@dataclass
class Child:
    """A new program parsed out of one variant slot, waiting for (or under) evaluation."""

    code: str
    parent_id: int | None
    island: int
    generation: int
    variant_id: int | None
    digest: str  # its normalised-code hash, computed once when it was parsed


class SearchLoop(GroupMaker):
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
        # cluster sandboxes evaluate without a thread per slot; asked once, not per child
        self.async_sandbox = sandbox if isinstance(sandbox, AsyncSandbox) else None
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
            signs=signs(problem.components),
        )
        self.hashes: dict[str, int | None] = {}
        self.children: asyncio.Queue[Child] = asyncio.Queue(maxsize=max(2 * options.workers, 4))
        self.results: asyncio.Queue[tuple[Child, EvalOutcome, Any, Any]] = asyncio.Queue()
        self.stop = asyncio.Event()
        self.reserved = 0  # evaluations committed plus those in flight
        self.finished_reason = ""
        self.fatal: Exception | None = None
        self.barren_groups = 0  # consecutive groups, sampled with nothing left to evaluate, that made no child
        self.in_flight = 0  # children taken by a worker whose result is not committed yet
        self.abandon = False  # leave queued children pending (Ctrl-C, systemic failure, evaluation budget)
        self.patience = Patience(options.patience)
        self.failures = FailureStreaks(options.max_failures)
        self.systemic: str | None = None  # the one line that stopped the run, when a failure repeated
        self.train_step = train_step
        self.groups_since_train = 0
        self.groups_started = 0
        self._version_rows: dict[int, int] = {}  # policy version number → its PolicyVersion row id

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
        self.hashes = dict(self.archive.code_hashes(self.run.id))
        self.stats.groups = self.groups_started = self.archive.count_groups(self.run.id)
        self.reserved = self.stats.evaluations

    def _count(self, member: Member, error_kind: str | None) -> None:
        self.stats.evaluations += 1
        if error_kind is None:
            self.stats.record_best(member.id, member.scalar, oriented_by_name(self.problem.components, member.oriented))
            self.patience.observe(self.stats.evaluations, member.scalar)
            if self.options.stop_when_solved and solved(self.problem.components, self._scores_of(member)):
                self._finish("solved: every component reached its best declared bound")
        self.stats.island_sizes = [isl.size for isl in self.population.islands]

    def _ensure_version_row(self) -> int:
        """The row id of the policy version now serving, inserting its row the first time it is seen."""
        number = self.policy.version
        if number not in self._version_rows:
            known = {v.number: v.id for v in self.archive.policy_versions(self.run.id)}
            self._version_rows.update(known)
            if number not in self._version_rows:
                self._version_rows[number] = self.archive.add_policy_version(
                    run_id=self.run.id, base_model=self.policy.name, number=number
                )
        self.stats.policy_version = number
        return self._version_rows[number]

    async def _requeue_pending(self) -> None:
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

    # ---- failures and stops -----------------------------------------------------------------------------
    def _finish(self, reason: str) -> None:
        self.finished_reason = self.finished_reason or reason
        self.stop.set()

    def _incident(self, failure: StageFailure) -> None:
        """Record one unexpected failure; the same kind at the same stage N times in a row stops the run."""
        kind = type(failure.exc).__name__
        self.stats.incidents += 1
        with contextlib.suppress(Exception):  # the archive itself may be what failed
            self.archive.add_incident(self.run.id, failure.stage, kind, str(failure.exc) or repr(failure.exc))
        count = self.failures.failed(failure.stage, kind)
        if self.failures.systemic(count) and self.systemic is None:
            self.systemic = (
                f"{count} {failure.stage} failures in a row ({kind}: {str(failure.exc)[:200]}); "
                "fix the cause, then run the same command (or `evolve resume DB`) to continue"
            )
            self.abandon = True
            self.stop.set()

    def _stage_ok(self, stage: str) -> None:
        self.failures.succeeded(stage)

    def _pending_work(self) -> int:
        return self.children.qsize() + self.in_flight + self.results.qsize()

    # ---- stages -----------------------------------------------------------------------------------------
    def _budget_left(self) -> bool:
        if self.stop.is_set():
            return False
        if self.options.max_time_s is not None and self.stats.elapsed_s >= self.options.max_time_s:
            self.finished_reason = self.finished_reason or "time budget reached"
            return False
        return self.reserved < self.options.max_evaluations

    async def generate(self) -> None:
        """Sample groups until the budget is spoken for; each group is committed before its children queue."""
        while self._budget_left() and self.reserved + self.children.qsize() < self.options.max_evaluations:
            index, self.groups_started = self.groups_started, self.groups_started + 1
            try:
                children, parent, island = await self._one_group(index)
            except StageFailure as failure:  # costs this group only
                self._incident(failure)
                continue
            produced = bool(children)
            for code, digest, variant_id in children:
                await self.children.put(Child(code, parent.id, island, parent.generation + 1, variant_id, digest))
            self._note_group(produced_children=produced)
            if not produced and self._pending_work():
                await self.children.join()  # repeating itself: let queued children land (new parents) first
            self.groups_since_train += 1
            if self.train_step is not None and self.groups_since_train >= self.options.train_every:
                await self._train()

    def _note_group(self, produced_children: bool) -> None:
        """Count the group; stop the run after MAX_BARREN_GROUPS in a row produced nothing new. A stall is
        judged on evaluated children: a barren group counts only when no child waits or is under evaluation,
        since the parents those children become may unblock the policy."""
        self.stats.groups += 1
        if produced_children:
            self.barren_groups = 0
        elif not self._pending_work():
            self.barren_groups += 1
        if self.barren_groups >= MAX_BARREN_GROUPS:
            self._finish(
                f"stalled: the last {MAX_BARREN_GROUPS} groups produced no new child "
                "(see parse statuses in evolve inspect)"
            )

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
        self._ensure_version_row()

    async def evaluate(self) -> None:
        """Drain the queue: a stop by budget, target, stall or patience still evaluates what is queued; only
        Ctrl-C, a systemic failure or the evaluation budget leave children pending for the next resume."""
        while True:
            child = await self.children.get()
            if self.abandon or self.reserved >= self.options.max_evaluations:
                self.children.task_done()
                continue  # left pending in the archive; a resumed run evaluates it
            self.reserved += 1
            self.in_flight += 1
            started = utcnow()
            try:
                if self.async_sandbox is not None:
                    outcome = await self.async_sandbox.aevaluate(self.problem, child.code)
                else:
                    outcome = await asyncio.to_thread(self.sandbox.evaluate, self.problem, child.code)
                self.failures.succeeded("evaluate")
            except Exception as exc:  # a sandbox bug must cost one evaluation, not the run
                self._incident(StageFailure("evaluate", exc))
                error = f"sandbox failure: {exc!r}"
                outcome = EvalOutcome.failure(self.problem, ErrorKind.CRASH, error, 0.0, self.sandbox.kind)
            await self.results.put((child, outcome, started, utcnow()))
            self.children.task_done()

    async def commit(self) -> None:
        """The single writer: whatever results have landed are committed together, one transaction a batch."""
        while True:
            batch = [await self.results.get()]
            while len(batch) < COMMIT_BATCH and not self.results.empty():
                batch.append(self.results.get_nowait())
            try:
                await self._commit(batch)
                self.failures.succeeded("commit")
            except Exception as exc:  # costs these children (left pending); a broken archive repeats and stops
                self.reserved -= len(batch)
                self._incident(StageFailure("commit", exc))
            finally:
                self.in_flight -= len(batch)
                for _ in batch:
                    self.results.task_done()

    async def _commit(self, batch: list[tuple[Child, EvalOutcome, Any, Any]]) -> None:
        """Write the batch on a worker thread, then update the index, population and stats here, on the loop:
        they are read by selection and the stop rules, which run on the loop, never beside a writer."""
        scalars, written = await asyncio.to_thread(self._write_batch, batch)
        for (child, outcome, _s, _f), scalar, (pid, created) in zip(batch, scalars, written, strict=True):
            self.hashes[child.digest] = pid
            self._record(child, outcome, scalar, pid, created)

    def _write_batch(
        self, batch: list[tuple[Child, EvalOutcome, Any, Any]]
    ) -> tuple[list[float], list[tuple[int, bool]]]:
        """Each result's scalar, and its program's (id, created) once the batch is committed."""
        scalars = [scalar_view(self.problem.components, outcome.scores) for _, outcome, _s, _f in batch]
        digests = [child.digest for child, *_ in batch]
        rows = [
            NewProgram(
                child.code,
                child.parent_id,
                child.island,
                child.generation,
                child.variant_id,
                dict(
                    scores=outcome.scores,
                    scalar=scalar,
                    error_kind=outcome.error_kind,
                    error=outcome.error,
                    duration_s=outcome.duration_s,
                    feedback=outcome.feedback,
                    stages=outcome.stages,
                    stdout=outcome.stdout[:STORED_OUTPUT],
                    stderr=outcome.stderr[-STORED_OUTPUT:],  # the tail holds the traceback
                    sandbox=outcome.sandbox,
                    case_errors=dict(outcome.case_errors) or None,
                    started_at=started,
                    finished_at=finished,
                ),
                digest,
            )
            for (child, outcome, started, finished), scalar, digest in zip(batch, scalars, digests, strict=True)
        ]
        return scalars, add_evaluated_programs(self.archive, self.run.id, rows)

    def _record(self, child: Child, outcome: EvalOutcome, scalar: float, pid: int, created: bool) -> None:
        if not created:
            self.reserved -= 1
            return
        member = self.population.member(pid, child.island, child.generation, outcome.scores, scalar, len(child.code))
        self.population.add(member if outcome.ok else None)
        self.stats.session_evaluations += 1
        self._count(member, outcome.error_kind)
        if outcome.error_kind:
            self.stats.errors[outcome.error_kind] += 1
        target = self.options.target
        if target is not None and self.stats.best_scalar is not None and self.stats.best_scalar >= target:
            self._finish(f"target {target} reached")
        if self.patience.exhausted(self.stats.evaluations):
            self._finish(f"patience: no new best scalar in {self.options.patience} evaluations")
        if self.stats.evaluations >= self.options.max_evaluations:
            self.finished_reason = self.finished_reason or "evaluation budget reached"

    # ---- the whole run ----------------------------------------------------------------------------------
    async def run_async(self) -> str:
        """Run to a stop; the run row is never left `running` unless the process is killed outright."""
        status = "failed"
        try:
            reason = await self._run_session()
            status = "stopped" if reason == "interrupted" or self.systemic else "finished"
            return reason
        except (KeyboardInterrupt, asyncio.CancelledError):  # a second Ctrl-C / SIGTERM
            status = "stopped"
            raise
        finally:
            with contextlib.suppress(Exception):
                state = {**self.run.state, "elapsed_s": self.stats.elapsed_s}
                state["stop_reason"] = self.systemic or self.finished_reason or f"{status} by an error"
                self.archive.update_run(self.run.id, status=status, state=state)
                self.run.state = state

    async def _run_session(self) -> str:
        self._rebuild()
        if self.stats.evaluations == 0:
            seed_digest = code_hash(self.problem.seed_code)
            self.hashes[seed_digest] = None
            self.reserved += 1
            started = utcnow()
            outcome = await asyncio.to_thread(self.sandbox.evaluate, self.problem, self.problem.seed_code)
            seed = Child(self.problem.seed_code, None, 0, 0, None, seed_digest)
            await self._commit([(seed, outcome, started, utcnow())])
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, self._interrupt)
            loop.add_signal_handler(signal.SIGTERM, self._interrupt)  # a polite kill stops cleanly too
        workers = [asyncio.create_task(self.evaluate()) for _ in range(self.options.workers)]
        committer = asyncio.create_task(self.commit())
        ticker = asyncio.create_task(self._save_elapsed())
        try:
            await self._requeue_pending()  # after the workers start: the queue is bounded
            while self._budget_left() and self.fatal is None:
                # Training pauses generation, so it needs a single generator; HTTP policies take several.
                parallel = 1 if self.train_step else max(1, min(self.policy.max_concurrency, 8))
                await asyncio.gather(*(self.generate() for _ in range(parallel)))
                await self.children.join()  # every queued child evaluated (or left pending on stop)
                await self.results.join()  # and every result committed
        finally:
            for task in (*workers, committer, ticker):
                task.cancel()
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)
                loop.remove_signal_handler(signal.SIGTERM)
            self._save_state()
        if self.fatal is not None:
            raise self.fatal
        if self.systemic:
            return f"stopped: {self.systemic}"
        if not self.finished_reason:
            self.finished_reason = "evaluation budget reached"
        return self.finished_reason

    def _interrupt(self) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt
        self.finished_reason = "interrupted"
        self.abandon = True  # queued children stay pending for the next resume
        self.stop.set()

    async def _save_elapsed(self) -> None:
        while True:
            await asyncio.sleep(5.0)
            await asyncio.to_thread(self._save_state)

    def _save_state(self) -> None:
        state: dict[str, Any] = {**self.run.state, "elapsed_s": self.stats.elapsed_s}
        self.archive.update_run(self.run.id, state=state)


def run_search(loop: SearchLoop) -> str:
    """Run a search on a fresh event loop with enough worker threads for every evaluation slot of a threaded
    sandbox plus the engine's own stages. asyncio's default pool has cores + 4 threads: a sandbox with more
    slots than that would get fewer evaluations in flight than `--workers` asks for, and the committer and
    the generator would queue behind them."""

    async def main() -> str:
        threads = ENGINE_THREADS + (0 if loop.async_sandbox is not None else loop.options.workers)
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(threads, thread_name_prefix="evolve"))
        return await loop.run_async()

    return asyncio.run(main())
