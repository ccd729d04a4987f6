"""What crosses the archive's boundary is a value: every public `Archive` method, after a small real run, answers
records and plain values (no SQLAlchemy object, bound or not), readable after the archive is closed; writes take
values; neither the engine nor a session is handed out; and the import contract that keeps the rest of the
engine off the ORM names every module of the engine."""

from __future__ import annotations

import dataclasses
import pkgutil
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import inspect as sa_inspect

import evolve
from evolve.archive import Archive, CompletionRecord, NewProgram
from evolve.archive.records import EvaluationRecord, RunState
from evolve.loop import SearchLoop, run_search
from evolve.problem.samples import FOUR, SQUARE
from evolve.problem.samples import full_answer as answer
from policies.replay import ReplayPolicy
from sandboxes.process import ProcessSandbox
from tests.helpers import square_run

ROOT = Path(__file__).resolve().parents[1]


def sqlalchemy_objects(value: Any, path: str = "") -> list[str]:
    """Where in `value` (lists, tuples, sets, dicts, dataclasses, walked all the way down) an object of
    SQLAlchemy sits: a mapped instance (an ORM row) or any other of its types (a Row, a Result)."""
    found: list[str] = []
    if sa_inspect(value, raiseerr=False) is not None or type(value).__module__.startswith("sqlalchemy"):
        return [f"{path or ' (the answer)'}: {type(value).__module__}.{type(value).__qualname__}"]
    if isinstance(value, dict):
        for k, v in value.items():
            found += sqlalchemy_objects(k, f"{path}[key {k!r}]") + sqlalchemy_objects(v, f"{path}[{k!r}]")
    elif isinstance(value, list | tuple | set | frozenset):
        for i, v in enumerate(value):
            found += sqlalchemy_objects(v, f"{path}[{i}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            found += sqlalchemy_objects(getattr(value, f.name), f"{path}.{f.name}")
    return found


def read_all(value: Any) -> Any:
    """Every attribute the value holds, read (a row detached from its session raises on a lazy one)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: read_all(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: read_all(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [read_all(v) for v in value]
    if hasattr(value, "__table__"):  # an ORM row (the old facade's answers): read each column and relationship
        return {name: getattr(value, name) for name in sa_inspect(type(value)).attrs.keys()}  # noqa: SIM118
    return value


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A finished run of the square problem (seed, a group, children, a policy version), its archive open."""
    tmp = tmp_path_factory.mktemp("records")
    problem, archive, run, options = square_run(tmp, max_evaluations=4, group_size=2)
    loop = SearchLoop(problem, archive, ReplayPolicy([answer(SQUARE, FOUR)]), ProcessSandbox(slots=2), run, options)
    try:
        run_search(loop)
    finally:
        loop.sandbox.close()
    yield archive, run.id, tmp / "a.db"
    archive.close()


def public_calls(archive: Archive, run_id: int) -> dict[str, Callable[[], Any]]:
    """One call of every public method of the facade, on the stored run (the writers on a run of their own)."""
    run = archive.find_run(run_id)
    other = archive.create_run("other", "/other", "fp", {"problem": {}}, 1)
    seed = min(p.id for p in archive.scored_programs(run_id))
    best = max(archive.scored_programs(run_id), key=lambda p: p.scalar or 0.0)
    record = EvaluationRecord({"c0": 1.0}, 1.0, None, None, 0.1, "test")
    versions = [v.id for v in archive.policy_versions(run_id)]
    group = [
        CompletionRecord("text", [1, 2], [-0.5, -1.0], "stop", versions[0]),
        CompletionRecord("more", [3], [-0.25], "stop", versions[0]),
    ]
    return {
        "create_run": lambda: archive.create_run("p", "/p", "fp", {}, 0),
        "find_run": lambda: [archive.find_run(run_id), archive.find_run(), archive.find_run(None, "square")],
        "runs": archive.runs,
        "update_run": lambda: archive.update_run(other.id, status="finished"),
        "add_incident": lambda: archive.add_incident(other.id, "store", "Boom", "it broke"),
        "add_policy_version": lambda: archive.add_policy_version(run_id=other.id, base_model="m", number=3),
        "policy_versions": lambda: [archive.policy_versions(run_id), archive.policy_versions(run_id, "replay")],
        "add_evaluated_programs": lambda: archive.add_evaluated_programs(
            other.id, [NewProgram(SQUARE, None, 0, 0, None, record)]
        ),
        "find_program": lambda: archive.find_program(run_id, SQUARE),
        "program": lambda: [archive.program(seed), archive.program(best.id), archive.program(10**6)],
        "scored_programs": lambda: archive.scored_programs(run_id),
        "codes": lambda: archive.codes([seed, best.id]),
        "count_programs": lambda: archive.count_programs(run_id),
        "code_hashes": lambda: archive.code_hashes(run_id),
        "upgrade_code_hashes": lambda: archive.upgrade_code_hashes(run_id),
        "evaluation_rows": lambda: archive.evaluation_rows(run),
        "lineage": lambda: archive.lineage(best.id),
        "ancestry": lambda: archive.ancestry([best.id, seed]),
        "add_group": lambda: archive.add_group(
            other.id,
            parent_id=seed,
            inspiration_ids=[],
            island=0,
            prompt="P",
            sampling={"temperature": 0.5},
            completions=group,
            variants=[[("ok", None, None)], [("parse_error", "no tag", None)]],
        ),
        "set_variant": lambda: archive.set_variant(1, detail="seen"),
        "pending_variants": lambda: archive.pending_variants(other.id),
        "count_groups": lambda: archive.count_groups(run_id),
        "group_outcomes": lambda: archive.group_outcomes(run_id),
        "group_rows": lambda: archive.group_rows(run_id, versions),
        "summarize": lambda: archive.summarize(run, {"c0": 1.0, "c1": -1.0}),
        "arms": lambda: archive.arms(run_id),
        "best_program": lambda: [archive.best_program(run), archive.best_program(run, "c0", sign=1.0)],
        "prompt_reads": lambda: archive.prompt_reads(seed, [best.id], 3, 2),
        "parent_context": lambda: archive.parent_context(seed),
        "recent_child_failures": lambda: archive.recent_child_failures(seed),
        "recent_children": lambda: archive.recent_children(seed),
        "seed_first_calls": lambda: archive.seed_first_calls(run_id),
    }


def test_every_public_method_answers_records_readable_after_close(stored):
    archive, run_id, db = stored
    methods = {
        name
        for name in dir(Archive)
        if not name.startswith("_") and callable(getattr(Archive, name)) and name != "close"
    }
    calls = public_calls(archive, run_id)
    answers = {name: call() for name, call in calls.items()}
    leaks = [f"{name}{where}" for name, value in answers.items() for where in sqlalchemy_objects(value)]
    assert leaks == [], "the archive handed out SQLAlchemy objects:\n" + "\n".join(leaks)
    assert methods <= set(calls), f"a public method this test does not call: {sorted(methods - set(calls))}"
    assert answers["program"][0] is not None and answers["program"][0].evaluation is not None
    assert answers["evaluation_rows"] and answers["best_program"][0] is not None

    reopened = Archive(db)
    try:  # the records of a second archive object, read after it is closed
        kept = [reopened.find_run(run_id), reopened.evaluation_rows(reopened.find_run(run_id)), reopened.runs()]
        kept += [reopened.best_program(reopened.find_run(run_id)), reopened.policy_versions(run_id)]
    finally:
        reopened.close()
    seen = read_all(kept)
    assert seen[0]["id"] == run_id and seen[0]["problem_name"] == "square"
    assert seen[1][0][0]["evaluation"]["scores"] == seen[1][0][1]["scores"]
    assert seen[3]["evaluation"]["error_kind"] is None


def test_records_cannot_be_changed_and_the_run_is_written_through_values(stored):
    """A record is a copy: assigning to it fails loudly instead of writing nothing; the archive's update takes
    the values, the state as the typed `RunState`, and a fresh read shows them."""
    archive, _, _ = stored
    other = archive.create_run("p", "/p", "fp", {"a": 1}, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        other.status = "finished"  # type: ignore[misc]
    archive.update_run(other.id, status="stopped", state=RunState(elapsed_s=3.0, stop_reason="asked"))
    again = archive.find_run(other.id)
    assert again is not None and again.status == "stopped" and again.config == {"a": 1}
    assert again.state.elapsed_s == 3.0 and again.state.stop_reason == "asked"
    assert other.status == "running"  # what the caller held is as it was read


def test_the_report_reads_answer_plain_values(stored):
    archive, run_id, _ = stored
    reads = archive.report_reads
    best = max(archive.scored_programs(run_id), key=lambda p: p.scalar or 0.0)
    answers = {
        "evaluation_table": reads.evaluation_table(run_id),
        "variant_times": reads.variant_times(run_id),
        "valid_child_times": reads.valid_child_times(run_id),
        "token_rows": reads.token_rows(run_id),
        "version_rows": reads.version_rows(run_id),
        "change_key": reads.change_key(run_id),
        "program_detail": [reads.program_detail(best.id), reads.program_detail(10**6)],
        "export_rows": reads.export_rows(run_id),
    }
    public = {name for name in dir(reads) if not name.startswith("_") and callable(getattr(reads, name))}
    assert public <= set(answers), sorted(public - set(answers))
    leaks = [f"{name}{where}" for name, value in answers.items() for where in sqlalchemy_objects(value)]
    assert leaks == [], "\n".join(leaks)
    table = answers["evaluation_table"]
    assert len(table.program_id) == len(table.scores_json) == archive.count_programs(run_id)
    assert answers["program_detail"][0].program.id == best.id and answers["program_detail"][1] is None


def test_the_archive_hands_out_no_engine_and_no_session(stored):
    archive, _, _ = stored
    assert not hasattr(archive, "engine") and not hasattr(archive, "session")


def test_the_import_contract_names_every_module_of_the_engine_but_the_archive():
    """A module added to the engine and left out of the contract could import the ORM unnoticed."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [c for c in config["contracts"] if "evolve.archive.models" in c.get("forbidden_modules", [])]
    assert "sqlalchemy" in contract["forbidden_modules"]
    engine = {f"evolve.{m.name}" for m in pkgutil.iter_modules(evolve.__path__)} - {"evolve.archive"}
    assert engine and engine <= set(contract["source_modules"]), sorted(engine - set(contract["source_modules"]))
