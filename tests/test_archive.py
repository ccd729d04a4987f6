"""The archive on a real SQLite file: schema versioning, transactions, dedup, blobs, concurrent readers."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import textwrap

import pytest

from evolve.archive import Archive, ArchiveError, CompletionRecord


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


@pytest.fixture
def archive(tmp_path):
    a = Archive(tmp_path / "a.db")
    yield a
    a.close()


def test_fresh_archive_is_at_head_and_in_wal_mode(tmp_path):
    Archive(tmp_path / "a.db").close()
    con = sqlite3.connect(tmp_path / "a.db")
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert con.execute("SELECT version_num FROM alembic_version").fetchone()[0] == _head()


def _head() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from evolve.archive.store import MIGRATIONS

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    heads = ScriptDirectory.from_config(cfg).get_heads()
    assert len(heads) == 1, f"migrations must form one line, heads: {heads}"
    return heads[0]


def test_migrations_build_exactly_the_models(tmp_path):
    """The tables Alembic builds are the ones the ORM declares: a column added without a migration fails."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from evolve.archive.models import Base

    archive = Archive(tmp_path / "a.db")
    with archive.engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    archive.close()
    assert diff == []


def test_newer_schema_is_refused(tmp_path):
    Archive(tmp_path / "a.db").close()
    con = sqlite3.connect(tmp_path / "a.db")
    con.execute("UPDATE alembic_version SET version_num = '9999'")
    con.commit()
    with pytest.raises(ArchiveError, match="newer than this vpo-evolve"):
        Archive(tmp_path / "a.db")


def test_missing_archive_is_reported_not_created(tmp_path):
    with pytest.raises(ArchiveError, match="no archive there"):
        Archive(tmp_path / "none.db", create=False)
    assert not (tmp_path / "none.db").exists()


def test_program_and_evaluation_commit_together_and_dedup(archive):
    run = archive.create_run("p", "/p", "fp", {}, 0)
    pid, created = archive.add_evaluated_program(
        run.id, "x = 1\n", parent_id=None, island=0, generation=0, evaluation=_eval()
    )
    assert created
    same, created = archive.add_evaluated_program(
        run.id, "x   =   1  # same program\n", parent_id=pid, island=1, generation=1, evaluation=_eval(2.0)
    )
    assert (same, created) == (pid, False)
    assert archive.count_programs(run.id) == 1
    with pytest.raises(Exception):  # noqa: B017 - an evaluation without its program must not half-land
        archive.add_evaluated_program(
            run.id, "y = 2\n", parent_id=None, island=0, generation=0, evaluation={"scores": {}, "bogus": 1}
        )
    assert archive.count_programs(run.id) == 1


def test_group_with_token_blobs_roundtrips(archive):
    run = archive.create_run("p", "/p", "fp", {}, 0)
    pid, _ = archive.add_evaluated_program(
        run.id, "x = 1\n", parent_id=None, island=0, generation=0, evaluation=_eval()
    )
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
    assert [(p[1], p[2], p[3]) for p in pending] == [(0, pid, "text")]
    from evolve.archive.models import Completion

    with archive.session() as s:
        first = s.get(Completion, 1)
        assert first.token_id_list == [1, 2, 3]
        assert first.logprob_list == [-0.5, -1.25, -2.0]


def test_reads_work_while_another_process_writes(tmp_path):
    db = tmp_path / "a.db"
    a = Archive(db)
    run = a.create_run("p", "/p", "fp", {}, 0)
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
        from evolve.archive import Archive
        a = Archive({str(db)!r})
        for i in range(300):
            a.add_evaluated_program({run.id}, f"x = {{i}}\\n", parent_id=None, island=0, generation=0,
                evaluation=dict(scores={{"a": 1.0}}, scalar=1.0, error_kind=None, error=None, duration_s=0.0,
                                feedback=None, stdout="", stderr="", sandbox="process"))
    """),
        ]
    )
    seen = []
    while writer.poll() is None:
        seen.append(a.count_programs(run.id))
    assert writer.wait() == 0
    assert seen == sorted(seen)
    assert a.count_programs(run.id) == 300
    assert len(a.scored_programs(run.id)) == 300
