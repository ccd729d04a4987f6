"""The search loop: select → prompt → sample a group → parse → evaluate → commit, with the stages overlapped.

One generator task feeds a bounded queue of children; N evaluation workers drain it through the sandbox;
a single committer writes each result as it lands (program and evaluation in one transaction) and updates
the in-memory population. Every prompt, completion and parsed variant is committed before its children are
evaluated, so a run killed at any moment resumes by re-parsing the variants whose evaluations never landed.

Nothing a model, a candidate or an evaluator produces ends a run: an unexpected exception while building a
prompt, sampling, parsing, storing, evaluating or committing costs that group or that child, is recorded as an
incident in the archive, and the run goes on; only the same failure `max_failures` times in a row stops it.
When a run ends by a budget, a target, a stall or patience, the children already queued are evaluated first;
reaching the goal (`--target`, or every component at its best bound) also cuts the group being sampled.
Ctrl-C stops within about a second, mid-generation too: the policy is told to stop between tokens and the loop
stops waiting for it; a group cut short is never committed, and queued children stay pending for the resume.
Mid-evaluation too: a sandbox that can (`AbortableSandbox`) kills the candidates running, their outcomes come
back marked aborted and are dropped, so those children stay pending as well and nothing counts as a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from evolve.adapt import Adapter, Ask
from evolve.archive import Archive, code_hash
from evolve.archive.models import Run, utcnow
from evolve.evaluated import program_rows
from evolve.fitness import oriented_by_name, signs, solved
from evolve.groups import Child, GroupMaker, StageFailure
from evolve.interrupt import cancel_on
from evolve.problem import Problem
from evolve.problem.outcome import ErrorKind, EvalOutcome
from evolve.runs import RunOptions
from evolve.selection import Member, Population, make_selector
from evolve.stats import LoopStats
from evolve.stopping import FailureStreaks, Patience, Stall
from policies.base import Policy
from sandboxes.base import AbortableSandbox, AsyncSandbox, Sandbox

COMMIT_BATCH = 64  # results written in one transaction at most
ENGINE_THREADS = 12  # worker threads beside evaluations: generators (8 at most), the committer, the state saver


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
        self.interrupted = asyncio.Event()  # Ctrl-C: a generation in flight is abandoned too
        self.sampling_cut = asyncio.Event()
        self.no_more_groups = False  # finish_generating(): no group starts, what is queued is evaluated
        self.reserved = 0  # evaluations committed plus those in flight
        self.finished_reason = ""
        self.fatal: Exception | None = None
        self.in_flight = 0  # children taken by a worker whose result is not committed yet
        self.abandon = False  # leave queued children pending (Ctrl-C, systemic failure, evaluation budget)
        self.patience = Patience(options.patience)
        self.failures = FailureStreaks(options.max_failures)
        self.systemic: str | None = None  # the one line that stopped the run, when a failure repeated
        self.stall = Stall(options.stall_groups)
        initial = Ask(options.edit_format, options.temperature, options.template)
        self.adapter = Adapter.restore(initial, run.state, every=options.adapt_every)
        self.stats.ask = self.adapter.ask.describe()
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
                self.cut_sampling()
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
        while self._may_generate():
            index, self.groups_started = self.groups_started, self.groups_started + 1
            try:
                made = await self._one_group(index)
            except StageFailure as failure:  # costs this group only
                self._incident(failure)
                continue
            if made is None:
                return  # cut short by Ctrl-C: nothing of the group was stored
            children, parent, island, statuses = made
            produced = bool(children)
            for code, digest, variant_id in children:
                await self.children.put(Child(code, parent.id, island, parent.generation + 1, variant_id, digest))
            self._note_group(index, produced, statuses)
            if not produced and self._pending_work():
                await self.children.join()  # repeating itself: let queued children land (new parents) first
            self.groups_since_train += 1
            if self.train_step is not None and self.groups_since_train >= self.options.train_every:
                await self._train()

    async def _train(self) -> None:
        """Pause generation, let the recent groups' evaluations land, update and publish the policy."""
        await self.children.join()
        await self.results.join()
        if self.sampling_cut.is_set():
            return  # the goal was reached or Ctrl-C came meanwhile: the run ends, an update would only delay it
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
            if outcome.aborted:  # killed by Ctrl-C: says nothing of the child, which stays pending
                self.reserved -= 1
                self.in_flight -= 1
            else:
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
        scalars, rows = program_rows(self.problem.components, batch)
        return scalars, self.archive.add_evaluated_programs(self.run.id, rows)

    def _record(self, child: Child, outcome: EvalOutcome, scalar: float, pid: int, created: bool) -> None:
        if not created:
            self.reserved -= 1
            return
        member = self.population.member(pid, child.island, child.generation, outcome.scores, scalar, len(child.code))
        self.population.add(member if outcome.ok else None)
        self.stats.session_evaluations += 1
        if outcome.ok and child.parent_id is not None:
            self.stats.new_valid += 1
        self._count(member, outcome.error_kind)
        if outcome.error_kind:
            self.stats.errors[outcome.error_kind] += 1
        target = self.options.target
        if target is not None and self.stats.best_scalar is not None and self.stats.best_scalar >= target:
            self._finish(f"target {target} reached")
            self.cut_sampling()
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
                state = self._state()
                state["stop_reason"] = self.systemic or self.finished_reason or f"{status} by an error"
                self.archive.update_run(self.run.id, status=status, state=state)
                self.run.state = state

    async def _run_session(self) -> str:
        self._rebuild()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, self._interrupt)
            loop.add_signal_handler(signal.SIGTERM, self._interrupt)  # a polite kill stops cleanly too
        workers = [asyncio.create_task(self.evaluate()) for _ in range(self.options.workers)]
        committer = asyncio.create_task(self.commit())
        ticker = asyncio.create_task(self._save_elapsed())
        timer = asyncio.create_task(self.watch_time_budget())
        try:
            if self.stats.evaluations == 0 and not await self._evaluate_seed():
                return self.finished_reason  # Ctrl-C while the seed ran: it stays to be evaluated on resume
            await self._requeue_pending()  # after the workers start: the queue is bounded
            while self._may_generate() and self.fatal is None:
                # Training pauses generation, so it needs a single generator; HTTP policies take several.
                parallel = 1 if self.train_step else max(1, min(self.policy.max_concurrency, 8))
                await asyncio.gather(*(self.generate() for _ in range(parallel)))
                await self._settle()
            await self._settle()  # children requeued on resume may fill the budget: no group runs, they still land
        finally:
            for task in (*workers, committer, ticker, timer):
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

    async def _evaluate_seed(self) -> bool:
        """Score and commit the seed; False when Ctrl-C aborted its evaluation (nothing was stored)."""
        seed_digest = code_hash(self.problem.seed_code)
        self.hashes[seed_digest] = None
        self.reserved += 1
        started = utcnow()
        outcome = await asyncio.to_thread(self.sandbox.evaluate, self.problem, self.problem.seed_code)
        if outcome.aborted:
            self.reserved -= 1
            return False
        seed = Child(self.problem.seed_code, None, 0, 0, None, seed_digest)
        await self._commit([(seed, outcome, started, utcnow())])
        return True

    async def _settle(self) -> None:
        """Wait until every queued child is evaluated (or left pending on stop) and every result committed.
        Ctrl-C cuts the wait short: evaluations in flight are abandoned and stay pending for the resume."""
        await cancel_on(self.interrupted, self._drained())

    async def _drained(self) -> None:
        await self.children.join()
        await self.results.join()

    def _interrupt(self) -> None:
        if self.interrupted.is_set():  # a second Ctrl-C
            raise KeyboardInterrupt
        self.finished_reason = "interrupted"
        self.abandon = True  # queued children stay pending for the next resume
        self.stop.set()
        self.interrupted.set()
        self.sampling_cut.set()
        self.interrupt_sampling()  # end the generation in flight between two tokens
        if isinstance(self.sandbox, AbortableSandbox):
            self.sandbox.abort_running()  # kill the candidates running; their outcomes come back aborted

    async def _save_elapsed(self) -> None:
        """Every 5 s: the state is read on the event loop, where the adapter changes it; only the write is
        threaded. A failed write is tried again 5 s later: the committer reports a database that is gone."""
        while True:
            await asyncio.sleep(5.0)
            state = self._state()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.archive.update_run, self.run.id, state=state)
                self.run.state = state

    def _state(self) -> dict[str, Any]:
        """The run's state as this session leaves it: time spent, and the ask with its recorded changes."""
        return {**self.run.state, **self.adapter.state(), "elapsed_s": self.stats.elapsed_s}

    def _save_state(self) -> None:
        state = self._state()
        self.archive.update_run(self.run.id, state=state)
        self.run.state = state


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
