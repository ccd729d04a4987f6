"""`Archive`: the one repository API the loop, the CLI, the report and the trainer share.

A facade over small stores that share one `Database`: runs (with incidents and policy versions), programs
(with evaluations and lineage), groups (prompts, completions, variants), a run's summary, and what a prompt
shows about a parent. Each store is one file with one job; callers keep one object to pass around and do not
need to know which store answers. The stores are public too (`archive.programs` ...) for code that wants one;
the report's reads are one of them (`archive.report_reads`).

Everything that crosses this boundary is a value: reads come back as records (`records.py`), never rows bound to
a session, and writes take values. Neither the engine nor a session is handed out, so the archive's modules are
the only ones that know its tables (an import-linter contract in pyproject.toml holds the rest of the engine to
it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from evolve.archive.arms import arm_rows
from evolve.archive.batch import NewProgram
from evolve.archive.database import Database
from evolve.archive.group_store import GroupOutcome, GroupRows, GroupStore
from evolve.archive.inserts import CompletionRecord, GroupTelemetry
from evolve.archive.lineage import LineageNode
from evolve.archive.parents import ChildFailure, ParentContext, ParentReads, PromptReads
from evolve.archive.program_store import HashUpgrade, ProgramStore, ScoredProgram
from evolve.archive.records import (
    PendingVariant,
    PolicyVersionRecord,
    ProgramRecord,
    RunRecord,
    RunState,
    StoredEvaluation,
    StoredProgram,
)
from evolve.archive.report_reads import ReportReads
from evolve.archive.run_store import RunStore
from evolve.archive.summary import RunSummary, summarize
from evolve.yields import Scale


class Archive:
    """Open (or, with `create`, make) the archive at a path or SQLAlchemy URL; `ArchiveError` says what is wrong."""

    def __init__(self, target: str | Path, *, create: bool = True) -> None:
        self.db = Database(target, create=create)
        self.url = self.db.url  # for messages: never shows a password
        self.run_store = RunStore(self.db)
        self.programs = ProgramStore(self.db)
        self.groups = GroupStore(self.db)
        self.parents = ParentReads(self.db)
        self.report_reads = ReportReads(self.db)

    def close(self) -> None:
        self.db.close()

    # ---- runs -------------------------------------------------------------------------------------------
    def create_run(
        self, problem_name: str, problem_dir: str, fingerprint: str, config: dict[str, Any], seed: int
    ) -> RunRecord:
        return self.run_store.create(problem_name, problem_dir, fingerprint, config, seed)

    def find_run(self, run_id: int | None = None, problem_name: str | None = None) -> RunRecord | None:
        """Run `run_id` (an `ArchiveError` when absent), else the latest run, of `problem_name` when given."""
        return self.run_store.find(run_id, problem_name)

    def runs(self) -> list[RunRecord]:
        return self.run_store.all()

    def update_run(
        self,
        run_id: int,
        *,
        status: str | None = None,
        config: dict[str, Any] | None = None,
        state: RunState | None = None,
    ) -> None:
        """Write the run's status, config or state (those given); the record a caller holds is not changed."""
        self.run_store.update(run_id, status=status, config=config, state=state)

    def add_incident(self, run_id: int, stage: str, kind: str, message: str) -> None:
        self.run_store.add_incident(run_id, stage, kind, message)

    def add_policy_version(
        self,
        *,
        run_id: int | None,
        base_model: str,
        adapter_path: str | None = None,
        parent_id: int | None = None,
        number: int = 0,
        train_config: dict[str, Any] | None = None,
        stats: dict[str, Any] | None = None,
        member: str | None = None,
    ) -> int:
        return self.run_store.add_policy_version(
            run_id=run_id,
            base_model=base_model,
            adapter_path=adapter_path,
            parent_id=parent_id,
            number=number,
            train_config=train_config,
            stats=stats,
            member=member,
        )

    def policy_versions(
        self, run_id: int | None = None, member: str | None = None, *, with_unnamed: bool = False
    ) -> list[PolicyVersionRecord]:
        return self.run_store.policy_versions(run_id, member, with_unnamed=with_unnamed)

    # ---- programs, evaluations, lineage ------------------------------------------------------------------
    def add_evaluated_programs(
        self, run_id: int, items: Sequence[NewProgram], multi_file: bool = False
    ) -> list[StoredProgram]:
        """The one way to store programs: with their evaluations, all or none; what became of each item.
        `multi_file`: the run's problem is one of several files (`Problem.multi_file`; see ProgramStore)."""
        return self.programs.add_evaluated(run_id, items, multi_file)

    def find_program(self, run_id: int, code: str, multi_file: bool = False) -> int | None:
        return self.programs.find(run_id, code, multi_file)

    def program(self, program_id: int) -> ProgramRecord | None:
        """One program with its full text and its evaluation."""
        return self.programs.get(program_id)

    def scored_programs(self, run_id: int) -> list[ScoredProgram]:
        return self.programs.scored(run_id)

    def codes(self, program_ids: Sequence[int]) -> dict[int, str]:
        return self.programs.codes(program_ids)

    def count_programs(self, run_id: int) -> int:
        return self.programs.count(run_id)

    def code_hashes(self, run_id: int) -> dict[str, int]:
        return self.programs.code_hashes(run_id)

    def upgrade_code_hashes(self, run_id: int, multi_file: bool = False) -> HashUpgrade:
        """Rehash a run stored under an earlier code normalisation (see `ProgramStore.upgrade_code_hashes`)."""
        return self.programs.upgrade_code_hashes(run_id, multi_file)

    def evaluation_rows(self, run: RunRecord) -> list[tuple[ProgramRecord, StoredEvaluation]]:
        return self.programs.evaluation_rows(run)

    def lineage(self, program_id: int, limit: int = 50) -> list[LineageNode]:
        """The program, its parent, and so on: `limit` programs at most."""
        return self.programs.lineage(program_id, limit)

    def ancestry(self, program_ids: Iterable[int | None], steps: int = 200) -> list[LineageNode]:
        """The union of the programs' ancestor chains, each walked at most `steps` parents up."""
        return self.programs.ancestry(program_ids, steps)

    # ---- groups: prompts, completions, variants ------------------------------------------------------------
    def add_group(
        self,
        run_id: int,
        *,
        parent_id: int,
        inspiration_ids: list[int],
        island: int,
        prompt: str,
        sampling: dict[str, Any],
        completions: Sequence[CompletionRecord],
        variants: Sequence[Sequence[tuple[str, str | None, int | None]]],
        telemetry: GroupTelemetry | None = None,
    ) -> list[list[int]]:
        return self.groups.add(
            run_id,
            parent_id=parent_id,
            inspiration_ids=inspiration_ids,
            island=island,
            prompt=prompt,
            sampling=sampling,
            completions=completions,
            variants=variants,
            telemetry=telemetry,
        )

    def set_variant(self, variant_id: int, **values: Any) -> None:
        self.groups.set_variant(variant_id, **values)

    def pending_variants(self, run_id: int) -> list[PendingVariant]:
        return self.groups.pending_variants(run_id)

    def count_groups(self, run_id: int) -> int:
        return self.groups.count(run_id)

    def group_outcomes(self, run_id: int) -> list[GroupOutcome]:
        return self.groups.outcomes(run_id)

    def group_rows(self, run_id: int, version_ids: Sequence[int], max_groups: int | None = None) -> GroupRows:
        return self.groups.rows_for_training(run_id, version_ids, max_groups)

    # ---- a run's summary and best programs ----------------------------------------------------------------
    def summarize(
        self, run: RunRecord, signs: Mapping[str, float], worst: Mapping[str, float] | None = None
    ) -> RunSummary:
        """Counts, errors, best per component and scalar, telemetry and yield. `signs`: +1 for a component to
        maximise, -1 to minimise (`evolve.fitness.signs`); a component not named is maximised. `worst`: each
        component's worst value, which a zero child scores on all (`evolve.yields.worst_values`)."""
        versions = self.run_store.policy_versions(run.id)
        with self.db.session() as s:
            return summarize(s, run, signs, versions, worst)

    def arms(
        self, run_id: int, signs: Mapping[str, float] | None = None, worst: Mapping[str, float] | None = None
    ) -> list[dict[str, Any]]:
        """Per ensemble member, then per ask arm: groups, shares, tokens, yield, improvements, zero children, best
        child. `signs` and `worst` as `summarize` takes them: they decide which children scored nothing."""
        scale = Scale(signs or {}, worst or {})
        with self.db.session() as s:
            return arm_rows(s, run_id, "member", scale) + arm_rows(s, run_id, "ask", scale)

    def best_program(self, run: RunRecord, component: str | None = None, *, sign: float = 1.0) -> ProgramRecord | None:
        """The best by scalar view, or by one component: `sign` -1 when that component is minimised."""
        if component is None:
            return self.programs.best_by_scalar(run)
        held = self.summarize(run, {component: sign}).best_components.get(component)
        return None if held is None else self.programs.get(held[0])

    # ---- what a prompt shows about a parent ------------------------------------------------------------
    def prompt_reads(
        self, parent_id: int, inspiration_ids: Sequence[int], failures: int, children: int, zero: Scale | None = None
    ) -> PromptReads:
        """What a prompt for `parent_id` shows: the codes, the parent's context, its newest children. `zero`: the
        problem's directions and worst values, to list its children that scored nothing among the failures (None:
        errors only)."""
        return PromptReads(
            self.codes([parent_id, *inspiration_ids]),
            self.parents.parent_context(parent_id),
            self.parents.recent_child_failures(parent_id, failures, zero),
            self.parents.recent_children(parent_id, children),
        )

    def parent_context(self, program_id: int) -> ParentContext:
        return self.parents.parent_context(program_id)

    def seed_first_calls(self, run_id: int) -> list[str]:
        return self.parents.seed_first_calls(run_id)

    def recent_child_failures(self, parent_id: int, limit: int = 3) -> list[ChildFailure]:
        return self.parents.recent_child_failures(parent_id, limit)

    def recent_children(self, parent_id: int, limit: int = 2) -> list[str]:
        return self.parents.recent_children(parent_id, limit)
