"""The search loop: select → prompt → sample a group → parse → evaluate → commit, with the stages overlapped.

The loop composes parts, each with its own interface (see docs/architecture.md):
- `RunControl` (evolve.control): the stop reason, Ctrl-C, cutting the group being sampled, the evaluation budget;
- `GroupSampler` (evolve.groups): one group from parent to stored variants, returned as a `GroupResult`;
- `EvaluationStage` (evolve.evaluation): N workers drain a bounded queue of children through the sandbox;
- `CommitStage` (evolve.commit): the single writer, results to program rows and population members.
The loop itself runs the generators, lets the ensemble (evolve.ensemble) choose the member and the ask of each
group, counts each group towards a stall, trains the trainable members every few groups, and keeps the run's row
and state up to date.

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
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from evolve.adapt import Ask, apply_arm, ask_arms
from evolve.archive import Archive, code_hash
from evolve.archive.models import Run
from evolve.children import Child, GroupResult, KnownCode
from evolve.commit import CommitStage
from evolve.control import Incidents, RunControl, StageFailure
from evolve.ensemble import Ensemble
from evolve.evaluation import EvaluationStage
from evolve.fitness import signs
from evolve.groups import GroupSampler
from evolve.interrupt import cancel_on
from evolve.members import MemberSpec
from evolve.policy_calls import PolicyCalls, PolicyMember, PolicyVersions, TrainStep
from evolve.problem import Problem
from evolve.runs import RunOptions
from evolve.selection import Population, make_selector
from evolve.stats import LoopStats
from evolve.stopping import Stall
from policies.base import Policy
from policies.trainer import UpdateAbandoned
from sandboxes.base import AbortableSandbox, Sandbox

ENGINE_THREADS = 12  # worker threads beside evaluations: generators (8 at most), the committer, the state saver


class SearchLoop:
    def __init__(
        self,
        problem: Problem,
        archive: Archive,
        policy: Policy,
        sandbox: Sandbox,
        run: Run,
        options: RunOptions,
        train_step: TrainStep | None = None,
        *,
        policies: Mapping[str, Policy] | None = None,
        train_steps: Mapping[str, TrainStep] | None = None,
        untrainable: Mapping[str, str] | None = None,
    ) -> None:
        """`policy` serves every member of `options.members()` that `policies` (member name → policy) leaves
        out, so a one-policy run passes just it; `train_step` trains the first member, `train_steps` any."""
        self.problem, self.archive, self.sandbox = problem, archive, sandbox
        self.run, self.options = run, options
        search = problem.config.search
        self.population = Population(
            problem.components,
            islands=search.islands,
            features=search.features,
            migration_interval=search.migration_interval,
            migration_size=search.migration_size,
        )
        self.stats = LoopStats(
            problem.component_names,
            options.max_evaluations,
            options.max_time_s,
            prior_elapsed_s=float(run.state.get("elapsed_s", 0.0)),
            sandbox=sandbox.kind,
            signs=signs(problem.components),
        )
        self.control = RunControl(
            options.max_evaluations,
            max_groups=options.max_groups,
            max_time_s=options.max_time_s,
            elapsed_s=lambda: self.stats.elapsed_s,
        )
        self.incidents = Incidents(archive, run.id, self.stats, self.control, options.max_failures)
        self.known = known = KnownCode()  # shared by the sampler (claims) and the commit stage (stored ids)
        specs = options.members()
        steps = dict(train_steps or {})
        if train_step is not None:
            steps.setdefault(specs[0].name, train_step)
        self.members: list[PolicyMember] = []
        for i, spec in enumerate(specs):
            served = (policies or {}).get(spec.name, policy)
            self.members.append(
                PolicyMember(
                    spec.name,
                    spec.weight,
                    self._base_ask(spec),
                    served,
                    PolicyCalls(served, self.control),
                    PolicyVersions(archive, run.id, served, self.stats, spec.name, first=i == 0),
                    steps.get(spec.name),
                    (untrainable or {}).get(spec.name),
                )
            )
        self.policy = self.members[0].policy
        asks = [a for a in ask_arms(options.asks) if any(apply_arm(a, m.base) != m.base for m in self.members)]
        self.ensemble = Ensemble(
            specs,
            ["base", *asks],
            allocation=options.allocation,
            cost=options.bandit_cost,
            seed=options.seed,
            state=run.state,
        )
        self.sampler = GroupSampler(
            problem,
            archive,
            run.id,
            options,
            self.population,
            make_selector(search.selection, len(problem.components)),
            self.stats,
            known,
            self.incidents,
            interrupted=self.control.interrupt_requested,
        )
        self.commits = CommitStage(
            problem,
            archive,
            run.id,
            options,
            self.population,
            self.stats,
            known,
            self.control,
            self.incidents,
            self._credit,
        )
        self.evaluation = EvaluationStage(problem, sandbox, self.control, self.incidents, self.commits, options.workers)
        self.stall = Stall(options.stall_groups)
        self.stats.ask = self.members[0].base.describe()
        self.stats.arms = self.ensemble.lines()
        # Counted across sessions (kept in the run's state): an update that a stop abandoned runs after the resume's
        # first group rather than N groups later.
        self.groups_since_train = int(run.state.get("groups_since_train", 0))
        self.groups_started = 0

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
        self.control.finish_generating()

    def close_policy(self) -> None:
        """Close the policy, unless Ctrl-C abandoned a call that may still run in its thread: freeing a model under
        a forward pass would crash the process, which ends right after such a stop anyway."""
        if any(m.calls.abandoned for m in self.members):
            return
        for policy in {id(m.policy): m.policy for m in self.members}.values():  # members may share one
            policy.close()

    def _pending_work(self) -> int:
        return self.sampler.unqueued + self.evaluation.pending() + self.commits.backlog

    def _may_generate(self) -> bool:
        return self.control.may_start_group(self.groups_started, self.evaluation.queue.qsize())

    # ---- generation -------------------------------------------------------------------------------------
    async def generate(self) -> None:
        """Sample groups until the budget is spoken for; each group is committed before its children queue."""
        while self._may_generate():
            index, self.groups_started = self.groups_started, self.groups_started + 1
            choice = self.ensemble.choose(index)
            member = self.members[choice.member]
            ask = apply_arm(choice.ask, member.base)
            self.stats.ask = f"{member.name}: {ask.describe()} ({choice.ask})"
            try:
                group = await self.sampler.make_group(index, member, ask, choice.ask)
            except StageFailure as failure:  # costs this group only
                self.incidents.record(failure)
                continue
            finally:
                self.ensemble.settled(member.name, choice.ask)
            if group is None:
                return  # cut short by Ctrl-C or the goal: nothing of the group was stored
            cost = group.cost
            self.ensemble.sampled(group.member, group.ask, cost.completions, cost.tokens, cost.seconds, group.statuses)
            for child in group.children:
                await self.evaluation.put(child)
            self.sampler.queued(len(group.children))
            self._note_group(group)
            if not group.produced and self._pending_work():  # repeating itself: let the children it copied land
                await self.sampler.all_queued.wait()  # (new parents) first, those of groups still storing too
                await self.evaluation.drained()
            self.groups_since_train += 1
            if self.training and self.groups_since_train >= self.options.train_every:
                await self._train()

    def _note_group(self, group: GroupResult) -> None:
        """Count the group towards a stall; a stalled run stops with one line saying what its groups wrote,
        which asks and members were tried, and what to change."""
        self.stats.groups += 1
        self.stats.arms = self.ensemble.lines()
        self.stall.observe(group.produced, bool(self._pending_work()), group.statuses)
        if self.stall.stalled:
            self.control.finish(self.stall.message(self.ensemble.tried(), self.stats.ask))

    def _credit(self, child: Child, scalar: float, program_id: int, new_best: bool) -> None:
        """A new valid child landed: its member and ask get its value."""
        if not child.member:
            return  # the seed, or a child of an archive older than ensembles
        improved = child.parent_scalar is not None and scalar > child.parent_scalar
        self.ensemble.credit(
            child.member, child.ask, improved=improved, new_best=new_best, scalar=scalar, program_id=program_id
        )
        self.stats.arms = self.ensemble.lines()

    async def _train(self) -> None:
        """Pause generation, let the recent groups' evaluations land, update and publish the policy.

        Ctrl-C or SIGTERM during an update gives it up between two groups (a thread cannot be cancelled, so the
        trainer asks `interrupt_requested`): it rolls back like a failed one, the run stops within one sample's
        forward and backward pass, and the group count is kept so that the resumed run trains after one group.
        The thread is still awaited: closing the policy under its backward pass would crash the process."""
        await self._drained()
        if self.control.sampling_cut.is_set():
            return  # the goal was reached or Ctrl-C came meanwhile: the run ends, an update would only delay it
        for member in self.members:  # each from its own groups (its own version lineage)
            if member.train_step is None:
                continue
            who = f"{member.name} " if len(self.members) > 1 else ""
            self.stats.updating = f"{who}from v{member.policy.version}"
            try:
                stats = await asyncio.to_thread(member.train_step, self.control.interrupt_requested)
                self.stats.train_updates += 1
                self.stats.last_train = f"{who}v{member.policy.version}: {stats.samples} samples, loss {stats.loss:.4g}"
            except UpdateAbandoned:  # rolled back; nothing of it was saved or published
                self.control.update_abandoned()
                return
            except Exception as exc:  # a failed update never stops the run; the old version keeps serving
                self.stats.train_failures += 1
                self.stats.last_train = (
                    f"{who}update failed ({type(exc).__name__}: {exc}); serving v{member.policy.version}"
                )
            finally:
                self.stats.updating = ""
            member.versions.serving()
        self.groups_since_train = 0

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
                state = self._state()
                state["stop_reason"] = self.control.stop_reason(status)
                self.archive.update_run(self.run.id, status=status, state=state)
                self.run.state = state
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)
                loop.remove_signal_handler(signal.SIGTERM)

    async def _run_session(self) -> str:
        self.commits.rebuild()
        self.stats.groups = self.groups_started = self.archive.count_groups(self.run.id)
        tasks = [asyncio.create_task(self.evaluation.work()) for _ in range(self.options.workers)]
        tasks += [asyncio.create_task(t) for t in (self.commits.work(), self._save_elapsed(), self._watch_time())]
        try:
            if self.stats.evaluations == 0 and not await self._evaluate_seed():
                return self.control.reason  # Ctrl-C while the seed ran: it stays to be evaluated on resume
            for child in self.sampler.resumed_children():  # after the workers start: the queue is bounded
                await self.evaluation.put(child)
                await asyncio.sleep(0)  # each child was parsed again (up to its deadline): let a Ctrl-C in
            while self._may_generate():
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
        return self.control.outcome()

    async def _evaluate_seed(self) -> bool:
        """Score and commit the seed; False when Ctrl-C aborted its evaluation (nothing was stored)."""
        seed = Child(self.problem.seed_code, None, 0, 0, None, code_hash(self.problem.seed_code))
        self.known.claim([seed.digest])
        self.control.reserve(force=True)
        result = await self.evaluation.score_seed(seed)
        if result is None:
            self.control.release()
            return False
        await self.commits.commit([result])
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
        self.control.finish("time budget reached")
        self.control.cut_sampling()

    async def _settle(self) -> None:
        """Wait until every queued child is evaluated (or left pending on stop) and every result committed.
        Ctrl-C cuts the wait short: evaluations in flight are abandoned and stay pending for the resume."""
        await cancel_on(self.control.interrupted, self._drained())

    async def _drained(self) -> None:
        await self.evaluation.drained()
        await self.commits.drained()

    def _interrupt(self) -> None:
        self.control.interrupt()  # a second Ctrl-C raises KeyboardInterrupt
        if isinstance(self.sandbox, AbortableSandbox):
            self.sandbox.abort_running()  # kill the candidates running; their outcomes come back aborted

    # ---- the run's state --------------------------------------------------------------------------------
    async def _save_elapsed(self) -> None:
        """Every 5 s: the state is read on the event loop, where the ensemble changes it; only the write is
        threaded. A failed write is tried again 5 s later: the committer reports a database that is gone."""
        while True:
            await asyncio.sleep(5.0)
            state = self._state()
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self.archive.update_run, self.run.id, state=state)
                self.run.state = state

    def _state(self) -> dict[str, Any]:
        """The run's state as this session leaves it: time spent, groups since an update, the ensemble's record."""
        counts = {"elapsed_s": self.stats.elapsed_s, "groups_since_train": self.groups_since_train}
        return {**self.run.state, **self.ensemble.state(), **counts}

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
        threads = ENGINE_THREADS + (0 if loop.evaluation.async_sandbox is not None else loop.options.workers)
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(threads, thread_name_prefix="evolve"))
        return await loop.run_async()

    return asyncio.run(main())
