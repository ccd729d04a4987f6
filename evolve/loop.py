"""The search loop: pick -> prompt -> sample -> parse -> admit -> store -> queue for each group, and evaluate ->
commit for each child, with the stages overlapped (docs/architecture.md, "One child through the engine").

Every fact of the run (population, code index, counters, budget, the ensemble's record, every stop rule) lives in
one `RunLedger` (evolve.ledger), which only the loop changes, on its event-loop thread, through the ledger's named
commands (Ctrl-C, the time limit and a lost session included). The stages hold none of it: each is handed values
and returns a record (evolve/handoffs.py) that the loop applies to the ledger: the `GroupSampler` a `SampledGroup`
(picked from the pool it is handed, prompted, sampled, parsed), which the ledger admits before the sampler stores
it as a `GroupResult`; the `Evaluator` an `Evaluated` child; the `ProgramWriter` a `StoredChild` per result. The
children's queue, evaluation workers and committer are the loop's own (evolve/flow.py). No stage holds a reference
to another stage, the loop or the ledger, and none calls back (tests/test_ledger_writers.py).

Every prompt, completion and parsed variant is committed before its children are evaluated, so a run killed at any
moment resumes by re-parsing the variants whose evaluations never landed.

Nothing a model, a candidate or an evaluator produces ends a run: an unexpected exception while building a
prompt, sampling, parsing, storing, evaluating or committing costs that group or that child, is recorded as an
incident in the archive, and the run goes on; only the same failure `max_failures` times in a row stops it.
When a run ends by a budget, a target, a stall or patience, the children already queued are evaluated first;
reaching the goal (`--target`, or every component at its best bound) also cuts the group being sampled.
Ctrl-C stops within about a second, mid-generation too: the policy is told to stop between tokens and the loop
stops waiting for it; a group cut short is never committed, and queued children stay pending for the resume.
Mid-evaluation too: a sandbox that can (`AbortableSandbox`) kills the candidates running, their outcomes come
back marked aborted and are dropped, so those children stay pending as well and nothing counts as a failure.
Mid-update too: the trainer gives the policy update up at its next sample, rolled back (see `_train`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from evolve.archive import Archive, RunRecord, RunState, code_hash
from evolve.ask_arms import Ask, apply_arm, ask_arms
from evolve.commit import ProgramWriter
from evolve.control import RunControl, StageFailure
from evolve.ensemble import Ensemble
from evolve.evaluation import Evaluator
from evolve.flow import ChildFlow, note_incident
from evolve.group_sampler import GroupSampler
from evolve.handoffs import Child, GroupResult
from evolve.interrupt import cancel_on
from evolve.ledger import RunLedger
from evolve.members import MemberSpec
from evolve.options import RunOptions
from evolve.policy_calls import PolicyCalls, PolicyMember, PolicyVersions, TrainStep
from evolve.problem import Problem
from evolve.problem.timeout_rule import RunTimeout
from evolve.selection import Population, make_selector
from evolve.stats import LoopStats
from policies.policy import Policy
from policies.trainer import UpdateAbandoned
from sandboxes.sandbox import AbortableSandbox, Sandbox

ENGINE_THREADS = 12  # worker threads beside evaluations: generators (8 at most), the committer, the state saver


class SearchLoop:
    # The run's timeout (evolve/problem/timeout_rule.py), set by build_search; None: the problem's limits as loaded.
    timeout: RunTimeout | None = None

    def __init__(
        self,
        problem: Problem,
        archive: Archive,
        policies: Policy | Mapping[str, Policy],
        sandbox: Sandbox,
        run: RunRecord,
        options: RunOptions,
        *,
        train_steps: Mapping[str, TrainStep] | None = None,
        untrainable: Mapping[str, str] | None = None,
    ) -> None:
        """`policies`: one policy that serves every member of `options.members()` (a one-policy run passes just
        it), or each member's by name; `train_steps`: the training step of each member that trains, by name."""
        self.problem, self.archive, self.sandbox = problem, archive, sandbox
        self.run, self.options = run, options
        self.save_every_s = 5.0  # the run's state (elapsed time, counters) written this often besides every commit
        # Asked with every state save: None while this session holds the problem's lock in the archive, else why
        # it stops (evolve/archive/session_lock.py: a lock lost under it and taken by another session).
        self.keep_session: Callable[[], str | None] = lambda: None
        specs = options.members()
        self.bases = {spec.name: self._base_ask(spec) for spec in specs}
        asks = [a for a in ask_arms(options.asks) if any(apply_arm(a, b) != b for b in self.bases.values())]
        state = run.state
        ensemble = Ensemble(
            specs,
            ["base", *asks],
            allocation=options.allocation,
            cost=options.bandit_cost,
            seed=options.seed,
            state={"ensemble": state.ensemble},
        )
        self.ledger = RunLedger(problem, options, state, ensemble, sandbox.kind)
        steps = dict(train_steps or {})
        self.members: list[PolicyMember] = []
        for i, spec in enumerate(specs):
            served = _served(policies, spec.name) if isinstance(policies, Mapping) else policies
            self.members.append(
                PolicyMember(
                    spec.name,
                    spec.weight,
                    self.bases[spec.name],
                    served,
                    PolicyCalls(served, self.control.signals.cut, self.control.signals.interrupted),
                    PolicyVersions(archive, run.id, served, spec.name, first=i == 0),
                    steps.get(spec.name),
                    (untrainable or {}).get(spec.name),
                )
            )
        self.policy = self.members[0].policy
        selector = make_selector(problem.config.search.selection, len(problem.components))
        self.sampler = GroupSampler(
            problem, archive, run.id, options, selector, interrupted=self.control.signals.interrupt_requested
        )
        self.evaluator = Evaluator(problem, sandbox)
        self.writer = ProgramWriter(problem, archive, run.id)
        self.flow = ChildFlow(self.ledger, self.evaluator, self.writer, archive, run.id, options.workers)
        self.ledger.asking(self.members[0].base.describe())

    # ---- read-only views of the ledger (the live view, the CLI, tests) ----------------------------------
    @property
    def stats(self) -> LoopStats:
        return self.ledger.stats

    @property
    def control(self) -> RunControl:
        return self.ledger.control

    @property
    def population(self) -> Population:
        return self.ledger.population

    @property
    def ensemble(self) -> Ensemble:
        return self.ledger.ensemble

    def _base_ask(self, spec: MemberSpec) -> Ask:
        """What a member asks under the `base` arm: its own settings, else the run's options."""
        o = self.options
        return Ask(
            spec.edit_format or o.edit_format,
            spec.temperature if spec.temperature is not None else o.temperature,
            spec.template or o.template,
            spec.top_p if spec.top_p is not None else o.top_p,
        )

    @property
    def training(self) -> bool:
        return any(m.train_step is not None for m in self.members)

    def finish_generating(self) -> None:
        """Start no further group; what is generated still gets evaluated (fixed-time benchmark runs)."""
        self.ledger.finish_generating()

    def close_policy(self) -> None:
        """Close the policy, unless Ctrl-C abandoned a call that may still run in its thread: freeing a model under
        a forward pass would crash the process, which ends right after such a stop anyway."""
        if any(m.calls.abandoned for m in self.members):
            return
        for policy in {id(m.policy): m.policy for m in self.members}.values():  # members may share one
            policy.close()

    def _pending_work(self) -> int:
        return self.ledger.unqueued + self.flow.pending()

    # ---- generation -------------------------------------------------------------------------------------
    async def generate(self) -> None:
        """Sample groups until the budget is spoken for; each group is committed before its children queue."""
        while (index := self.ledger.next_group(self.flow.queue.qsize())) is not None:
            choice = self.ledger.choose(index)
            member = self.members[choice.member]
            ask = apply_arm(choice.ask, member.base)
            self.ledger.asking(f"{member.name}: {ask.describe()} ({choice.ask})")
            try:
                group = await self.group(index, member, ask, choice.ask)
            except StageFailure as failure:  # costs this group only
                note_incident(self.ledger, self.archive, self.run.id, failure)
                continue
            finally:
                self.ledger.settled(member.name, choice.ask)
            if group is None:
                return  # cut short by Ctrl-C or the goal: nothing of the group was stored
            if not group.children and self._pending_work():  # repeating itself: let the children it copied land
                await self.ledger.all_queued.wait()  # (new parents) first, those of groups still storing too
                await self.flow.drained()
            if self.training and self.ledger.training_due():
                await self._train()

    async def group(self, index: int, member: PolicyMember, ask: Ask, arm: str = "base") -> GroupResult | None:
        """One group: sampled, admitted by the ledger, stored, its children queued; None when it was cut short
        (nothing of it is stored). Raises `StageFailure` naming the step that failed."""
        sampled = await self.sampler.sample(index, member, ask, self.ledger.parent_pool(index))
        if sampled is None:
            return None
        admitted = self.ledger.admit(sampled.parsed, sampled.tokens, sampled.cut)
        try:
            group = await self.sampler.store(sampled, admitted, member, ask, arm)
        except StageFailure:
            self.ledger.store_failed(admitted)
            raise
        self.ledger.group_charged(group)  # before its children queue: the other generators' choices see its cost
        for child in group.children:
            await self.flow.put(child)
        self.ledger.group_queued(group, self.flow.pending())
        return group

    async def _train(self) -> None:
        """Pause generation, let the recent groups' evaluations land, update and publish the policy.

        Ctrl-C or SIGTERM during an update gives it up between two groups (a thread cannot be cancelled, so the
        trainer asks `signals.interrupt_requested`): it rolls back like a failed one, the run stops within one sample's
        forward and backward pass, and the group count is kept so that the resumed run trains after one group.
        The thread is still awaited: closing the policy under its backward pass would crash the process."""
        await self._drained()
        if self.control.sampling_cut.is_set():
            return  # the goal was reached or Ctrl-C came meanwhile: the run ends, an update would only delay it
        for member in self.members:  # each from its own groups (its own version lineage)
            if member.train_step is None:
                continue
            who = f"{member.name} " if len(self.members) > 1 else ""
            self.ledger.updating(f"{who}from v{member.policy.version}")
            try:
                stats = await asyncio.to_thread(member.train_step, self.control.signals.interrupt_requested)
                line = f"{who}v{member.policy.version}: {stats.samples} samples, loss {stats.loss:.4g}"
                self.ledger.trained(line)
            except UpdateAbandoned:  # rolled back; nothing of it was saved or published
                self.ledger.update_abandoned()
                return
            except Exception as exc:  # a failed update never stops the run; the old version keeps serving
                line = f"{who}update failed ({type(exc).__name__}: {exc}); serving v{member.policy.version}"
                self.ledger.trained(line, failed=True)
            member.versions.serving()
        self.ledger.trained_all(self.members[0].versions.number)

    # ---- the whole run ----------------------------------------------------------------------------------
    async def run_async(self) -> str:
        """Run to a stop; the run row is never left `running` unless the process is killed outright: the signal
        handlers stay until it is written, so that a second SIGTERM right after the first never kills it first."""
        status = "failed"
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, self._interrupt)
            loop.add_signal_handler(signal.SIGTERM, self._interrupt)  # a polite kill stops cleanly too
        try:
            reason = await self._run_session()
            status = self.control.status()
            return reason
        except (KeyboardInterrupt, asyncio.CancelledError):  # a second Ctrl-C / SIGTERM
            status = "stopped"
            raise
        finally:
            with contextlib.suppress(Exception):
                state = self.ledger.snapshot(stop_reason=self.control.stop_reason(status))
                self.archive.update_run(self.run.id, status=status, state=state)
                self._saved(state, status)
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)
                loop.remove_signal_handler(signal.SIGTERM)

    async def _run_session(self) -> str:
        self.ledger.replay(self.writer.replay())
        tasks = [asyncio.create_task(self.flow.evaluate()) for _ in range(self.options.workers)]
        tasks += [asyncio.create_task(t) for t in (self.flow.commit_landed(), self._save_elapsed(), self._watch_time())]
        try:
            if self.stats.evaluations == 0 and not await self._evaluate_seed():
                return self.control.reason  # Ctrl-C while the seed ran: it stays to be evaluated on resume
            await self._requeue_pending()
            while self.ledger.groups_go_on(self.flow.queue.qsize()):
                # Training pauses generation, so it needs a single generator; HTTP policies take several.
                concurrency = min(m.policy.max_concurrency for m in self.members)
                parallel = 1 if self.training else max(1, min(concurrency, 8))
                await asyncio.gather(*(self.generate() for _ in range(parallel)))
                await self._settle()
            await self._settle()  # children requeued on resume may fill the budget: no group runs, they still land
        finally:
            for task in tasks:
                task.cancel()
            self._save_state()
        return self.ledger.conclude()

    async def _requeue_pending(self) -> None:
        """On resume, after the workers start (the queue is bounded): the variants whose evaluations never landed,
        parsed again; one that makes no new child now gets its status stored instead."""
        for resumed in self.sampler.resumed():
            try:
                if isinstance(resumed, StageFailure):
                    raise resumed
                digest = self.ledger.admit_resumed(resumed.code)
                if digest is None or resumed.code is None:
                    self.sampler.mark(resumed, "duplicate" if resumed.code else resumed.status)
                    continue
            except Exception as exc:  # one unreadable pending variant must not stop the resume
                failure = exc if isinstance(exc, StageFailure) else StageFailure("parse", exc)
                note_incident(self.ledger, self.archive, self.run.id, failure)
                continue
            p = resumed.pending
            child = Child(
                code=resumed.code,
                parent_id=p.parent_id,
                island=p.island,
                generation=resumed.generation,
                variant_id=p.variant_id,
                digest=digest,
                member=p.member or "",
                ask=p.ask or "",
                parent_scalar=resumed.parent_scalar,
            )
            await self.flow.put(child)
            await asyncio.sleep(0)  # each child was parsed again (up to its deadline): let a Ctrl-C in

    async def _evaluate_seed(self) -> bool:
        """Score and commit the seed; False when Ctrl-C aborted its evaluation (nothing was stored)."""
        code = self.problem.seed_code
        digest = code_hash(code, self.problem.multi_file)
        seed = Child(code=code, parent_id=None, island=0, generation=0, variant_id=None, digest=digest)
        self.ledger.seed_claimed(seed)
        result = await self.evaluator.score_seed(seed)
        if result is None:
            self.ledger.release()
            return False
        if self.timeout is not None:  # a problem without a timeout takes one from its seed's time
            self.timeout.seed_scored(result.outcome)
        await self.flow.commit([result])
        if not result.outcome.ok:  # no program may be a parent: stop with why, before groups fail to pick one
            self.ledger.seed_failed(result.outcome.error_kind, result.outcome.error)
        return True

    async def _watch_time(self) -> None:
        """`--max-time`: once the run's time is spent, stop it and cut the group being sampled, as Ctrl-C does (the
        group is not stored) rather than letting a minutes-long group overrun the limit; queued children are
        still scored, as on any budget stop."""
        limit = self.options.max_time_s
        if limit is None:
            return
        while (left := limit - self.stats.elapsed_s) > 0:
            await asyncio.sleep(min(left, 1.0))
        self.ledger.time_spent()

    async def _settle(self) -> None:
        """Wait until every queued child is evaluated (or left pending on stop) and every result committed.
        Ctrl-C cuts the wait short: evaluations in flight are abandoned and stay pending for the resume."""
        await cancel_on(self.control.interrupted, self._drained())

    async def _drained(self) -> None:
        await self.flow.drained()

    def _interrupt(self) -> None:
        self.ledger.interrupt()  # a second Ctrl-C raises KeyboardInterrupt
        if isinstance(self.sandbox, AbortableSandbox):
            self.sandbox.abort_running()  # kill the candidates running; their outcomes come back aborted
        self.evaluator.abort()  # and the evaluator's score() calls in flight, which may never return by themselves

    # ---- the run's state --------------------------------------------------------------------------------
    async def _save_elapsed(self) -> None:
        """Every `save_every_s`: the state is read on the event loop, where the ledger changes it; only the write
        is threaded. A failed write is tried again next time: the committer reports a database that is gone."""
        while True:
            await asyncio.sleep(self.save_every_s)
            state = self.ledger.snapshot()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.archive.update_run, self.run.id, state=state)
                self._saved(state)
            lost = await asyncio.to_thread(self.keep_session)
            if lost is not None:
                self.ledger.session_lost(lost)

    def _save_state(self) -> None:
        state = self.ledger.snapshot()
        self.archive.update_run(self.run.id, state=state)
        self._saved(state)

    def _saved(self, state: RunState, status: str | None = None) -> None:
        """Keep the run's record in step with what was just written: a loop built on it later resumes from it (a
        record left `running` after a clean end would count a kill that never happened)."""
        self.run = replace(self.run, state=state, status=status or self.run.status)


def _served(policies: Mapping[str, Policy], member: str) -> Policy:
    if member not in policies:
        raise ValueError(f"no policy for the ensemble member {member!r}: pass one policy, or one per member by name")
    return policies[member]


def run_search(loop: SearchLoop) -> str:
    """Run a search on a fresh event loop with enough worker threads for every evaluation slot of a threaded
    sandbox plus the engine's own stages. asyncio's default pool has cores + 4 threads: a sandbox with more
    slots than that would get fewer evaluations in flight than `--workers` asks for, and the committer and
    the generator would queue behind them."""

    async def main() -> str:
        threads = ENGINE_THREADS + (0 if loop.evaluator.async_sandbox is not None else loop.options.workers)
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(threads, thread_name_prefix="evolve"))
        return await loop.run_async()

    return asyncio.run(main())
