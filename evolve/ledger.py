"""The run's ledger: every fact of a running search in one object, changed by one writer.

The population, the code index (what makes a variant a duplicate), the counters, the evaluation budget, the
ensemble's record and every stop rule live here. The stages (sampling a group, evaluating a child, writing
programs) hold none of it: each returns a record of what happened, and the loop, on its own event-loop thread,
applies that record here (`admit`, `group_charged`, `group_queued`, `committed`, `incident`, ...) and asks
for the next group (`next_group`). What the loop itself decides (Ctrl-C, the time limit, a lost session, the end
of a benchmark's generating) it asks of the ledger by name too (`interrupt`, `time_spent`, `session_lost`,
`finish_generating`, `conclude`), so the counters, the budgets and the stop reason have this one writer; its
`RunControl` is changed from here only. Readers elsewhere (the live view, the report) read; queries here
(`may_start_group`, `training_due`, `parent_pool`, `groups_started`) write nothing. tests/test_ledger_writers.py
reads the code of evolve/, policies/ and sandboxes/ and fails on a call to a mutator of the ledger, its control,
population, counters or stop rules from any other module, so no two writers can interleave and the order of
events is the order of the loop's calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from evolve.archive import code_hash
from evolve.archive.records import RunState, VariantRow
from evolve.code_index import CodeIndex
from evolve.control import RunControl, StageFailure
from evolve.ensemble import Choice, Ensemble
from evolve.fitness import oriented_by_name, raw_scores, signs, solved
from evolve.handoffs import Admitted, Child, GroupResult, HashedVariant, NewVariant, ScoredRun, StoredChild
from evolve.options import RunOptions
from evolve.problem import Problem
from evolve.selection import PoolView, Population, RankedProgram
from evolve.stats import LoopStats
from evolve.stopping import FailureStreaks, Patience, Stall
from evolve.yields import QualityTally, Scale, worst_values

# The steps of a group in order: a failure at one means those before it succeeded (their streaks end).
GROUP_STAGES = ("prompt", "sample", "parse", "store")


@dataclass(frozen=True)
class IncidentSeen:
    """What the loop writes to the archive for one incident, and the line that stops the run when it repeated."""

    stage: str
    kind: str
    message: str
    systemic: str | None


class RunLedger:
    def __init__(self, problem: Problem, options: RunOptions, state: RunState, ensemble: Ensemble, sandbox: str):
        search = problem.config.search
        self.problem, self.options, self.ensemble = problem, options, ensemble
        self.population = Population(
            problem.components,
            islands=search.islands,
            features=search.features,
            migration_interval=search.migration_interval,
            migration_size=search.migration_size,
            spent_weight=options.spent_parent_weight,
        )
        self.known = CodeIndex()
        self.stats = LoopStats(
            problem.component_names,
            options.max_evaluations,
            options.max_time_s,
            prior_elapsed_s=state.elapsed_s,
            sandbox=sandbox,
            signs=signs(problem.components),
            quality=QualityTally(Scale(signs(problem.components), worst_values(problem.components))),
        )
        self.control = RunControl(
            options.max_evaluations,
            max_groups=options.max_groups,
            max_time_s=options.max_time_s,
            elapsed_s=lambda: self.stats.elapsed_s,
            evaluations=lambda: self.stats.evaluations,  # held once, in the counters
        )
        self.stall, self.patience = Stall(options.stall_groups), Patience(options.patience)
        self.streaks = FailureStreaks(options.max_failures)
        self.state = state
        self.session_groups_started = 0  # groups given an index this session (stored, failed or in flight)
        # Counted across sessions: an update that a stop abandoned runs after the resume's first group.
        self.groups_since_train = state.groups_since_train
        # Children admitted from a group still being stored or queued: pending work, so that groups finished
        # meanwhile (whose copies of them are duplicates) do not count towards a stall.
        self.unqueued = 0
        self.all_queued = asyncio.Event()  # set while no admitted child waits for its group to be stored and queued
        self.all_queued.set()
        self.stats.arms = ensemble.lines()

    # ---- groups -----------------------------------------------------------------------------------------
    @property
    def groups_started(self) -> int:
        """The run's groups given an index, earlier sessions' stored ones included (the group budget counts them)."""
        return self.stats.prior_groups + self.session_groups_started

    def may_start_group(self, queued: int) -> bool:
        """Budget left for another group: time, evaluations (queued children counted), the group budget. A query:
        `groups_go_on` is the command that records which budget ran out."""
        return self.control.may_start_group(self.groups_started, queued)

    def groups_go_on(self, queued: int) -> bool:
        """Whether another group may start; when a budget ran out (time, groups), its reason is recorded."""
        refusal = self.control.group_refusal(self.groups_started, queued)
        if refusal:
            self.control.budget_spent(refusal)
        return refusal is None

    def next_group(self, queued: int) -> int | None:
        """The index of the next group, claimed, or None when no budget is left for one (its reason recorded)."""
        if not self.groups_go_on(queued):
            return None
        index = self.groups_started
        self.session_groups_started += 1
        return index

    def parent_pool(self, index: int) -> PoolView:
        """The pool group `index` picks its parent from (its island's, by the index), detached from the population."""
        return self.population.view(index % len(self.population.islands))

    def choose(self, index: int) -> Choice:
        return self.ensemble.choose(index)

    def asking(self, line: str) -> None:
        self.stats.ask = line

    def settled(self, member: str, arm: str) -> None:
        """The group of `member` and `arm` is done, stored or not: it no longer counts as in flight."""
        self.ensemble.settled(member, arm)

    def admit(self, parsed: Sequence[Sequence[HashedVariant]], tokens: Iterable[int], cut: int = 0) -> Admitted:
        """Each parsed variant's status (a copy of known code is a duplicate) and the group's new children, whose
        hashes are claimed at once so that a group sampled beside this one sees them as known. `cut`: how many of
        the completions stopped at their token budget. The group was prompted, sampled and parsed: those stages'
        failure streaks end at once (a failure of a group sampled beside this one starts afresh)."""
        self.ok("prompt", "sample", "parse")
        self.stats.cut += cut
        rows, new, fresh = [], [], dict[str, None]()
        for completion, count in zip(parsed, tokens, strict=True):
            self.stats.tokens += count
            self.stats.completions += 1
            row = []
            for hashed in completion:
                variant, digest = hashed.variant, hashed.digest
                status, program_id = variant.status, None
                if variant.code is not None and digest is not None:
                    if digest in self.known or digest in fresh:
                        status, program_id = "duplicate", self.known.program(digest)
                    else:
                        fresh[digest] = None
                        new.append(NewVariant(len(rows), variant.slot, variant.code, digest))
                self.stats.parse[status] += 1
                row.append(VariantRow(status, variant.detail, program_id))
            rows.append(row)
        self.known.claim(fresh)
        self._unqueued(len(new))
        return Admitted(rows, new)

    def _unqueued(self, change: int) -> None:
        self.unqueued += change
        if self.unqueued:
            self.all_queued.clear()
        else:
            self.all_queued.set()

    def store_failed(self, admitted: Admitted) -> None:
        """The group was not stored: its children never will be, so their hashes are free again."""
        self.known.forget(v.digest for v in admitted.new)
        self._unqueued(-len(admitted.new))

    def group_charged(self, group: GroupResult) -> None:
        """A group is stored (the store stage's failure streak ends): the ensemble charges its member and ask what
        it cost and records what it wrote."""
        self.ok("store")
        cost = group.cost
        self.ensemble.sampled(group.member, group.ask, cost.completions, cost.tokens, cost.seconds, group.statuses)
        self.stats.policy_version = group.policy_version
        self.stats.arms = self.ensemble.lines()

    def group_queued(self, group: GroupResult, pending: int) -> None:
        """A stored group's children are queued: it counts towards a stall (`pending`: children queued, under
        evaluation or not yet committed, which may unblock the policy), and a stalled run stops with one line
        saying what its groups wrote and what to change."""
        self._unqueued(-len(group.children))
        self.population.group_done(group.parent.id, group.cost.completions, len(group.children))
        self.groups_since_train += 1
        self.stats.session_groups += 1
        self.stall.observe(group.produced, bool(pending + self.unqueued), group.statuses)
        if self.stall.stalled:
            self.control.finish(self.stall.message(self.ensemble.tried(), self.stats.ask))

    def admit_resumed(self, code: str | None) -> str | None:
        """A pending variant parsed again on resume: its hash, claimed, or None when it is not a new child."""
        if code is None:
            return None
        digest = code_hash(code, self.problem.multi_file)
        if digest in self.known:
            return None
        self.known.claim([digest])
        return digest

    # ---- evaluations ------------------------------------------------------------------------------------
    def reserve(self, *, force: bool = False) -> bool:
        return self.control.reserve(force=force)

    def release(self, count: int = 1) -> None:
        self.control.release(count)

    def replay(self, scored: ScoredRun) -> None:
        """The archive's programs and groups, at the start of a session: population (its parents' spent streaks
        too), code index, counters, budget (the evaluations counted are the budget's too, and the groups stored
        are what the group budget and the counters start from)."""
        for row in scored.programs:
            ok = row.error_kind is None and row.scalar is not None
            self.stats.quality.known(row.id, row.scores, row.scalar, ok)  # parents and best of this session's
            ranked = self.population.ranked(
                row.id, row.island, row.generation, row.scores, row.scalar or 0.0, row.code_length
            )
            self.population.add(ranked if ok else None)
            self._count(ranked, row.error_kind)
        for group in scored.groups:
            self.population.group_done(group.parent_id, group.completions, group.new_programs)
        self.known.load(scored.code_index)
        self.stats.prior_groups = len(scored.groups)

    def seed_claimed(self, seed: Child) -> None:
        self.known.claim([seed.digest])
        self.control.reserve(force=True)

    def committed(self, batch: Sequence[StoredChild]) -> None:
        """A batch of scored children is committed: each applied, then the commit stage's failure streak ends (not
        before: a batch whose application fails is a commit failure, and the same one repeated stops the run)."""
        for stored in batch:
            self.child_stored(stored)
        self.ok("commit")

    def child_stored(self, stored: StoredChild) -> None:
        """A scored child's program row is committed: the population, the counters, the member and ask that wrote
        it, and the stop rules that read scores (target, patience, solved, the evaluation budget). Its evaluation's
        reservation is not ended here but by the committer (`ChildFlow.commit`), once for the whole batch, so that
        a step here that raises cannot have it ended twice."""
        child, outcome = stored.child, stored.outcome
        self.known.stored(child.digest, stored.program_id)
        if not stored.created:
            return
        ranked = self.population.ranked(
            stored.program_id, child.island, child.generation, outcome.scores, stored.scalar, len(child.code)
        )
        self.population.add(ranked if outcome.ok else None)
        self.stats.session_evaluations += 1
        best_before = self.stats.best_scalar
        self._count(ranked, outcome.error_kind)
        tally = self.stats.quality
        if child.parent_id is None:
            tally.known(stored.program_id, outcome.scores, stored.scalar, outcome.ok)
        elif tally.child(stored.program_id, child.parent_id, outcome.scores, stored.scalar, outcome.ok).valid:
            self.stats.new_valid += 1  # a zero child is not valid (evolve.yields.ChildVerdict)
            self._credit(child, stored.scalar, stored.program_id, best_before)  # nor is it worth a member's credit
        if outcome.error_kind:
            self.stats.errors[outcome.error_kind] += 1
        target = self.options.target
        if target is not None and self.stats.best_scalar is not None and self.stats.best_scalar >= target:
            self.control.finish(f"target {target} reached")
            self.control.cut_sampling()
        if self.patience.exhausted(self.stats.evaluations):
            self.control.finish(f"patience: no new best scalar in {self.options.patience} evaluations")
        self.control.counted()

    def _credit(self, child: Child, scalar: float, program_id: int, best_before: float | None) -> None:
        """A new valid child: its member and ask get its value (the seed and pre-ensemble children name none)."""
        if not child.member:
            return
        improved = child.parent_scalar is not None and scalar > child.parent_scalar
        new_best = best_before is not None and scalar > best_before
        self.ensemble.credit(
            child.member, child.ask, improved=improved, new_best=new_best, scalar=scalar, program_id=program_id
        )
        self.stats.arms = self.ensemble.lines()

    def _count(self, ranked: RankedProgram, error_kind: str | None) -> None:
        self.stats.evaluations += 1
        if error_kind is None:
            components = self.problem.components
            self.stats.record_best(ranked.id, ranked.scalar, oriented_by_name(components, ranked.oriented))
            self.patience.observe(self.stats.evaluations, ranked.scalar)
            if self.options.stop_when_solved and solved(components, raw_scores(components, ranked.oriented)):
                self.control.finish("solved: every component reached its best declared bound")
                self.control.cut_sampling()
        self.stats.island_sizes = [isl.size for isl in self.population.islands]

    # ---- incidents --------------------------------------------------------------------------------------
    def ok(self, *stages: str) -> None:
        """These stages succeeded: their failure streaks end."""
        for stage in stages:
            self.streaks.succeeded(stage)

    def incident(self, failure: StageFailure) -> IncidentSeen:
        """One unexpected failure; the same kind at the same stage `max_failures` times in a row stops the run."""
        if failure.stage in GROUP_STAGES:
            self.ok(*GROUP_STAGES[: GROUP_STAGES.index(failure.stage)])
        kind = type(failure.exc).__name__
        self.stats.incidents += 1
        count = self.streaks.failed(failure.stage, kind)
        line = None
        if self.streaks.systemic(count):
            line = (
                f"{count} {failure.stage} failures in a row ({kind}: {str(failure.exc)[:200]}); "
                "fix the cause, then run the same command (or `evolve resume DB`) to continue"
            )
            self.control.fail_systemic(line)
        return IncidentSeen(failure.stage, kind, str(failure.exc) or repr(failure.exc), line)

    # ---- what the loop decides, recorded here ------------------------------------------------------------
    def finish_generating(self) -> None:
        """Start no further group; what is generated still gets evaluated (fixed-time benchmark runs)."""
        self.control.finish_generating()

    def time_spent(self) -> None:
        """`--max-time` ran out: no group starts, and the one being sampled is cut (not stored)."""
        self.control.finish("time budget reached")
        self.control.cut_sampling()

    def interrupt(self) -> None:
        """Ctrl-C or SIGTERM: stop now, leave queued children pending; a second one raises KeyboardInterrupt."""
        self.control.interrupt()

    def seed_failed(self, kind: object, error: str | None) -> None:
        """The seed failed its evaluation: nothing can be a parent, so the run stops at once with its error, not
        after a streak of groups that found no parent (or, under a small group budget, as "group budget reached")."""
        said = " ".join((error or "no error given").split())[:300]
        what = getattr(kind, "value", kind)
        self.control.fail_systemic(
            f"the seed failed its evaluation ({what}: {said}); fix the seed or its evaluator (`evolve check PROBLEM` "
            "scores the seed alone)"
        )

    def session_lost(self, line: str) -> None:
        """Another session took the problem's lock: stop at once, as a repeated failure does."""
        self.control.fail_systemic(line)

    def conclude(self) -> str:
        """Why the session ended, settled (the evaluation budget when no other reason was given)."""
        return self.control.conclude()

    # ---- training ---------------------------------------------------------------------------------------
    def training_due(self) -> bool:
        return self.groups_since_train >= self.options.train_every

    def updating(self, line: str) -> None:
        self.stats.updating = line

    def trained(self, line: str, *, failed: bool = False) -> None:
        self.stats.updating = ""
        self.stats.last_train = line
        if failed:
            self.stats.train_failures += 1
        else:
            self.stats.train_updates += 1

    def update_abandoned(self) -> None:
        self.stats.updating = ""
        self.control.update_abandoned()

    def trained_all(self, policy_version: int) -> None:
        self.groups_since_train = 0
        self.stats.policy_version = policy_version

    # ---- the run's state --------------------------------------------------------------------------------
    def snapshot(self, *, stop_reason: str | None = None) -> RunState:
        """The run's state as this session leaves it, one typed value (saved every few seconds and at the end)."""
        changes = {"elapsed_s": self.stats.elapsed_s, "groups_since_train": self.groups_since_train}
        changes["ensemble"] = self.ensemble.state()["ensemble"]
        if stop_reason is not None:
            changes["stop_reason"] = stop_reason
        self.state = self.state.updated(**changes)
        return self.state
