"""The archive on a real SQLite file and a real PostgreSQL server: schema versioning, transactions, dedup, blobs,
concurrent readers. Tests taking `db_url` run once on each database."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import create_engine, event, inspect, text
from sqlalchemy.exc import IntegrityError

from evolve.archive import Archive, ArchiveError, CompletionRecord, NewProgram
from evolve.archive.records import EvaluationRecord
from tests.helpers import store_program


def _eval(scalar: float = 1.0) -> dict:
    return dict(
        scores={"a": scalar},
        scalar=scalar,
        error_kind=None,
        error=None,
        duration_s=0.01,
        feedback=None,
        stdout="",
        stderr="",
        sandbox="process",
    )


def _record(scalar: float = 1.0) -> EvaluationRecord:
    return EvaluationRecord(**_eval(scalar))


@pytest.fixture
def archive(db_url):
    a = Archive(db_url)
    yield a
    a.close()


def _script_head() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from evolve.archive.database import MIGRATIONS

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(cfg).get_current_head()


def test_fresh_archive_is_at_head_and_in_wal_mode(tmp_path):
    Archive(tmp_path / "a.db").close()
    con = sqlite3.connect(tmp_path / "a.db")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("SELECT version_num FROM alembic_version").fetchone()[0] == _script_head()


def test_migrations_build_exactly_the_models(tmp_path):
    """The tables Alembic builds are the ones the ORM declares: a column added without a migration fails."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from evolve.archive.models import Base

    archive = Archive(tmp_path / "a.db")
    with archive.db.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    archive.close()
    assert diff == []


def test_fresh_archive_on_any_database_is_at_head(db_url):
    a = Archive(db_url)
    with a.db.session() as s:
        assert s.execute(text("SELECT version_num FROM alembic_version")).scalar() == _script_head()
    a.close()


def test_newer_schema_is_refused(db_url):
    a = Archive(db_url)
    with a.db.session() as s:
        s.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    a.close()
    with pytest.raises(ArchiveError, match="newer than this vpo-evolve"):
        Archive(db_url)


def test_missing_archive_is_reported_not_created(db_url):
    with pytest.raises(ArchiveError, match="no archive there"):
        Archive(db_url, create=False)
    if "://" not in db_url:
        assert not Path(db_url).exists()
    else:  # the empty database stays empty: a reader never creates the schema
        engine = create_engine(db_url)
        assert not inspect(engine).has_table("alembic_version")
        engine.dispose()


def test_two_engines_opening_one_fresh_archive_migrate_once(db_url):
    """Several workers started at once on a new database: the schema is made once, nobody fails."""
    script = f"from evolve.archive import Archive; Archive({db_url!r}).close()"
    procs = [subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    a = Archive(db_url, create=False)
    assert a.runs() == []
    a.close()


def test_program_and_evaluation_commit_together_and_dedup(archive):
    run = archive.create_run("p", "/p", "fp", {}, 0)
    pid, created = store_program(archive, run.id, "x = 1\n", evaluation=_eval())
    assert created
    same, created = store_program(
        archive, run.id, "x   =   1  # same program\n", parent_id=pid, island=1, generation=1, evaluation=_eval(2.0)
    )
    assert (same, created) == (pid, False)
    assert archive.count_programs(run.id) == 1
    with pytest.raises(Exception):  # noqa: B017 - an evaluation without its program must not half-land
        store_program(archive, run.id, "y = 2\n", evaluation={"scores": {}, "bogus": 1})
    assert archive.count_programs(run.id) == 1


def test_group_with_token_blobs_roundtrips(archive):
    run = archive.create_run("p", "/p", "fp", {}, 0)
    pid, _ = store_program(archive, run.id, "x = 1\n", evaluation=_eval())
    version = archive.add_policy_version(run_id=run.id, base_model="tiny")
    recs = [
        CompletionRecord("text", [1, 2, 3], [-0.5, -1.25, -2.0], "stop", version),
        CompletionRecord("no logprobs", None, None, "length", version),
    ]
    ids = archive.add_group(
        run.id,
        parent_id=pid,
        inspiration_ids=[pid],
        island=0,
        prompt="P",
        sampling={"temperature": 0.8},
        completions=recs,
        variants=[[("ok", None, None), ("parse_error", "no tag", None)], [("empty", None, None)]],
    )
    assert [len(v) for v in ids] == [2, 1]
    pending = archive.pending_variants(run.id)
    assert [(p.slot, p.parent_id, p.completion_text) for p in pending] == [(0, pid, "text")]
    from evolve.archive.models import Completion

    with archive.db.session() as s:
        first = s.get(Completion, 1)
        assert first.token_id_list == [1, 2, 3]
        assert first.logprob_list == [-0.5, -1.25, -2.0]


def test_reads_work_while_another_process_writes(db_url):
    db = db_url
    a = Archive(db)
    run = a.create_run("p", "/p", "fp", {}, 0)
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        from evolve.archive import Archive, NewProgram
        from evolve.archive.records import EvaluationRecord
        a = Archive({str(db)!r})
        for i in range(300):
            evaluation = EvaluationRecord(scores={{"a": 1.0}}, scalar=1.0, error_kind=None, error=None,
                                          duration_s=0.0, sandbox="process", stdout="", stderr="")
            a.add_evaluated_programs({run.id}, [NewProgram(f"x = {{i}}\\n", None, 0, 0, None, evaluation)])
    """),
        ]
    )
    seen = []
    while writer.poll() is None:
        seen.append(a.count_programs(run.id))
    assert writer.wait() == 0
    assert seen == sorted(seen)
    assert any(0 < n < 300 for n in seen), "the reader never saw the writer part-way"
    assert a.count_programs(run.id) == 300
    assert len(a.scored_programs(run.id)) == 300
    a.close()


def test_a_batch_commits_together_and_dedups_against_archive_and_itself(archive):
    run = archive.create_run("p", "/p", "fp", {}, 0)
    first, _ = store_program(archive, run.id, "x = 1\n", evaluation=_eval())
    items = [
        NewProgram("y = 2\n", first, 0, 1, None, _record(2.0)),
        NewProgram("x  =  1\n", first, 1, 1, None, _record(3.0)),  # the seed again, respelled
        NewProgram("y = 2  # again\n", first, 1, 1, None, _record(4.0)),  # the first item again
        NewProgram("z = 3\n", first, 0, 1, None, _record(5.0)),
    ]
    results = archive.add_evaluated_programs(run.id, items)
    assert [created for _, created in results] == [True, False, False, True]
    assert results[1][0] == first and results[2][0] == results[0][0]
    assert archive.count_programs(run.id) == 3
    assert sorted(p.scalar for p in archive.scored_programs(run.id)) == [1.0, 2.0, 5.0]
    with pytest.raises(Exception):  # noqa: B017 - one bad row: nothing of the batch lands
        archive.add_evaluated_programs(
            run.id,
            [
                NewProgram("w = 4\n", first, 0, 1, None, _record()),
                NewProgram("v = 5\n", first, 0, 1, None, replace(_record(), scores={"a": {1.0}})),  # not JSON
            ],
        )
    assert archive.count_programs(run.id) == 3


def test_a_batch_links_each_variant_to_its_program_or_marks_it_a_duplicate(archive):
    """The committer's multi-row path: a new child's variant points at its program; a child already in the
    archive (or earlier in the batch) makes its variant a duplicate of that program, and nothing stays pending."""
    run = archive.create_run("p", "/p", "fp", {}, 0)
    seed, _ = store_program(archive, run.id, "x = 1\n", evaluation=_eval())
    [slots] = archive.add_group(
        run.id,
        parent_id=seed,
        inspiration_ids=[],
        island=0,
        prompt="P",
        sampling={},
        completions=[CompletionRecord("t", None, None, "stop", None)],
        variants=[[("ok", None, None)] * 4],
    )
    codes = ["y = 2\n", "x = 1  # the seed\n", "y  =  2\n", "z = 3\n"]
    items = [
        NewProgram(code, seed, 0, 1, vid, _record(float(k)))
        for k, (code, vid) in enumerate(zip(codes, slots, strict=True))
    ]
    results = archive.add_evaluated_programs(run.id, items)
    assert [created for _, created in results] == [True, False, False, True]
    rows = _variant_rows(archive)
    assert [rows[vid] for vid in slots] == [
        ("ok", results[0][0]),
        ("duplicate", seed),
        ("duplicate", results[0][0]),
        ("ok", results[3][0]),
    ]
    assert archive.pending_variants(run.id) == []
    assert sorted(p.scalar for p in archive.scored_programs(run.id)) == [0.0, 1.0, 3.0]


def _variant_rows(archive: Archive) -> dict[int, tuple[str, int | None]]:
    from evolve.archive.models import Variant

    with archive.db.session() as s:
        return {v.id: (v.status, v.program_id) for v in s.query(Variant)}


def test_two_writers_racing_on_the_same_code_end_with_one_program_and_a_duplicate(archive, db_url):
    """Another writer commits the same program between this batch's look-up and its insert: the insert fails on
    the unique code hash, the batch is tried again, and it ends with the other writer's id for that child (its
    variant a duplicate, its evaluation not stored twice) and a new program for the rest."""
    run = archive.create_run("p", "/p", "fp", {}, 0)
    seed, _ = store_program(archive, run.id, "x = 1\n", evaluation=_eval())
    [slots] = archive.add_group(
        run.id,
        parent_id=seed,
        inspiration_ids=[],
        island=0,
        prompt="P",
        sampling={},
        completions=[CompletionRecord("t", None, None, "stop", None)],
        variants=[[("ok", None, None)] * 2],
    )
    other = Archive(db_url)  # a second engine on the same database: another writer
    raced: list[tuple[int, bool]] = []

    def other_writer_first(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("INSERT INTO PROGRAMS") and not raced:
            respelled = "y = 2  # the other writer's spelling\n"
            raced.append(store_program(other, run.id, respelled, parent_id=seed, generation=1, evaluation=_eval(7.0)))

    event.listen(archive.db.engine, "before_cursor_execute", other_writer_first)
    try:
        items = [
            NewProgram("y = 2\n", seed, 0, 1, slots[0], _record(2.0)),
            NewProgram("z = 3\n", seed, 0, 1, slots[1], _record(3.0)),
        ]
        results = archive.add_evaluated_programs(run.id, items)
    finally:
        event.remove(archive.db.engine, "before_cursor_execute", other_writer_first)
        other.close()
    [(theirs, made)] = raced
    assert made
    assert results[0] == (theirs, False)
    assert results[1][1] and results[1][0] not in (seed, theirs)
    variants = _variant_rows(archive)
    assert [variants[vid] for vid in slots] == [("duplicate", theirs), ("ok", results[1][0])]
    assert archive.count_programs(run.id) == 3
    assert sorted(p.scalar for p in archive.scored_programs(run.id)) == [1.0, 3.0, 7.0]  # theirs, never ours


def test_a_constraint_broken_by_the_batch_itself_is_raised_not_retried(archive):
    """An integrity error no other writer explains (here a parent that does not exist) ends the call with the
    error, and nothing of the batch lands."""
    run = archive.create_run("p", "/p", "fp", {}, 0)
    seed, _ = store_program(archive, run.id, "x = 1\n", evaluation=_eval())
    items = [
        NewProgram("y = 2\n", seed, 0, 1, None, _record()),
        NewProgram("z = 3\n", seed + 1000, 0, 1, None, _record()),
    ]
    with pytest.raises(IntegrityError):
        archive.add_evaluated_programs(run.id, items)
    assert archive.count_programs(run.id) == 1


MINIMISED_RUN = {
    "problem": {"fitness": {"components": [{"name": "cost", "direction": "minimize", "fail_value": 99.0}]}}
}


def _costs_run(archive: Archive) -> tuple[object, list[int]]:
    """A run whose one component is minimised: three programs in a line, costs 5, 2, 8."""
    run = archive.create_run("p", "/p", "fp", MINIMISED_RUN, 0)
    ids: list[int] = []
    for k, cost in enumerate((5.0, 2.0, 8.0)):
        evaluation = {**_eval(-cost), "scores": {"cost": cost}}
        pid, _ = store_program(archive, run.id, f"x = {k}\n", parent_id=ids[-1] if ids else None, evaluation=evaluation)
        ids.append(pid)
    return run, ids


def test_summary_and_best_take_each_components_direction_as_a_value(archive):
    run, ids = _costs_run(archive)
    assert archive.summarize(run, {"cost": -1.0}).best_components == {"cost": (ids[1], 2.0)}
    assert archive.summarize(run, {}).best_components == {"cost": (ids[2], 8.0)}  # not named: maximised
    assert archive.best_program(run, "cost", sign=-1.0).id == ids[1]
    assert archive.best_program(run).id == ids[1]  # by scalar view
    assert archive.best_program(run, "nothing") is None


def test_best_on_a_minimised_component_from_the_command_line(tmp_path):
    """`evolve best --component` reads the run's directions from its stored problem and hands them on."""
    archive = Archive(tmp_path / "a.db")
    _costs_run(archive)
    archive.close()
    out = subprocess.run(
        [sys.executable, "-m", "evolve.cli", "best", str(tmp_path / "a.db"), "--component", "cost"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "x = 1\n"


def test_lineage_and_ancestry_walk_the_same_parents(archive):
    run, ids = _costs_run(archive)
    side, _ = store_program(archive, run.id, "y = 1\n", parent_id=ids[0], evaluation=_eval(0.5))
    assert [n.id for n in archive.lineage(ids[2])] == [ids[2], ids[1], ids[0]]
    assert [n.id for n in archive.lineage(ids[2], limit=2)] == [ids[2], ids[1]]
    assert [(n.id, n.parent_id, n.scalar) for n in archive.ancestry([ids[2], side])] == [
        (ids[0], None, -5.0),
        (ids[1], ids[0], -2.0),
        (ids[2], ids[1], -8.0),
        (side, ids[0], 0.5),
    ]
    assert [n.id for n in archive.ancestry([ids[2]], steps=1)] == [ids[1], ids[2]]
    assert archive.lineage(10_000) == [] and archive.ancestry([None]) == []


def test_code_hash_memo_gives_the_parsed_hash_and_stays_bounded():
    """Text seen before is hashed from the memo, to the same value a fresh parse gives; the memo forgets its
    oldest entries at its bound."""
    from evolve.archive.codehash import CodeHasher, normalized_hash

    hasher = CodeHasher(memo_size=8)
    texts = [f"def f(x):\n    return x + {i}  # note {i}\n" for i in range(20)]
    first = [hasher.hash(t) for t in texts]
    assert first == [normalized_hash(t) for t in texts]
    assert hasher.remembered == 8
    assert [hasher.hash(t) for t in texts] == first  # forgotten ones parse again, remembered ones do not
    assert hasher.remembered == 8
    assert hasher.hash("def f(x):\n    return x + 3\n") == first[3]  # layout and comments do not count
    assert hasher.hash("def f(:\n") == hasher.hash("def f(:   \n\n")  # unparseable: by lines


def test_the_evaluation_record_names_every_column_the_archive_stores_for_an_evaluation():
    """The typed record is the check that a dict's keys once were: a column it lacks would be NULL for every
    evaluation, a field the table lacks would fail every insert."""
    from dataclasses import fields

    from evolve.archive.models import Evaluation

    stored = {c.key for c in Evaluation.__table__.columns} - {"id", "program_id", "created_at"}
    assert {f.name for f in fields(EvaluationRecord)} == stored
