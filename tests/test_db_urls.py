"""`--db` / `DB` in every archive command: a path, `sqlite:///relative.db`, `sqlite:////absolute.db` and a
PostgreSQL URL all name the same kind of archive, and none loses its `//` on the way in."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.archive import Archive, ArchiveError, archive_url, sqlite_file
from evolve.cli import app
from evolve.search import adapters_next_to
from tests.helpers import write_problem

FULL = "<variant 1>\n```python\ndef solve(x):\n    return {a}\n```\n</variant 1>\n"


def test_archive_url_turns_every_form_into_one_absolute_url(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    absolute = f"sqlite:///{tmp_path / 'runs' / 'a.db'}"
    assert archive_url("runs/a.db") == absolute
    assert archive_url(tmp_path / "runs" / "a.db") == absolute
    assert archive_url("sqlite:///runs/a.db") == absolute
    assert archive_url(f"sqlite:///{tmp_path}/runs/a.db") == absolute  # i.e. sqlite:////tmp/...
    assert archive_url("sqlite://") == "sqlite://"  # in memory stays in memory
    pg = "postgresql+psycopg://evolve:s3cret@db.example:5433/search"
    assert archive_url(pg) == pg  # the password is kept for connecting ...
    assert sqlite_file(archive_url(pg)) is None
    assert sqlite_file(absolute) == tmp_path / "runs" / "a.db"
    with pytest.raises(ArchiveError, match="not a database URL"):
        Archive("postgresql+psycopg://evolve@host:notaport/db")
    with pytest.raises(ArchiveError, match=r"driver is not installed; pip install 'vpo-evolve\[mysql\]'"):
        Archive("mysql://u@localhost/db")


def test_messages_never_show_the_password(postgres_cluster):
    url = postgres_cluster.new_database()
    with_password = url.replace("evolve@", "evolve:hunter2@")
    a = Archive(with_password)  # trust authentication ignores the password
    assert "hunter2" not in a.url and "***" in a.url
    a.close()


def test_adapters_sit_next_to_a_sqlite_archive_in_any_spelling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    expected = tmp_path / "runs" / "x.adapters"
    for spelling in ("runs/x.db", "sqlite:///runs/x.db", f"sqlite:///{tmp_path}/runs/x.db"):
        assert adapters_next_to(spelling, "x") == expected, spelling
    assert adapters_next_to("postgresql+psycopg://u@h/db", "x") == Path("runs") / "x.adapters"


@pytest.fixture(params=["path", "sqlite-relative", "sqlite-absolute", "postgresql"])
def db_spelling(request, tmp_path, monkeypatch):
    """(text given to --db, a function counting evaluations in that archive)."""
    monkeypatch.chdir(tmp_path)
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_cluster").new_database()

        def count() -> int:
            a = Archive(url, create=False)
            n = sum(a.count_programs(r.id) for r in a.runs())
            a.close()
            return n

        return url, count
    given = {
        "path": "runs/a.db",
        "sqlite-relative": "sqlite:///runs/a.db",
        "sqlite-absolute": f"sqlite:///{tmp_path}/runs/a.db",  # four slashes
    }[request.param]

    def count_sqlite() -> int:
        return sqlite3.connect(tmp_path / "runs" / "a.db").execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]

    return given, count_sqlite


@pytest.mark.slow
def test_every_archive_command_takes_each_spelling(tmp_path, db_spelling):
    db, count = db_spelling
    folder = write_problem(tmp_path / "prob", name="urls")
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([FULL.format(a=e) for e in ("x * x + 0", "x ** 2", "x + x", "abs(x) * x")]))
    runner = CliRunner()

    def invoke(*args: str) -> str:
        result = runner.invoke(app, list(args), catch_exceptions=False)
        assert result.exit_code == 0, (args, result.output)
        return result.output

    run_args = [
        "run", str(folder), "--db", db, "--policy", f"replay:{replay}", "--sandbox", "process", "--workers", "1",
        "--group-size", "2", "--variants", "1", "--edit-format", "full", "--max-evaluations", "4",
        "--no-stop-when-solved",  # the seed already scores 1.0 on every bounded case
    ]  # fmt: skip
    out = invoke(*run_args)
    assert "evaluation budget reached" in out, out
    assert count() == 4
    again = invoke(*run_args)  # the same command resumes the finished run and adds nothing
    assert "resuming run 1" in again and count() == 4
    summary = json.loads(invoke("inspect", db, "--json"))
    assert summary[0]["evaluations"] == 4 and summary[0]["problem"] == "urls"
    assert "def solve" in invoke("best", db)
    assert "lineage" in invoke("show", db, "1")
    assert "wrote 4 evaluations" in invoke("export", db, str(tmp_path / "out"))
    assert len((tmp_path / "out" / "evaluations.csv").read_text().splitlines()) == 5
    assert invoke("report", db).startswith("# urls: run 1")
    # train reaches the run's recorded policy (a replay policy cannot learn): the archive was found and read
    trained = runner.invoke(app, ["train", db])
    assert trained.exit_code == 2 and "cannot load new adapters" in trained.output, trained.output


def test_readers_refuse_a_missing_archive_in_each_spelling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    for db in ("none.db", "sqlite:///none.db", f"sqlite:///{tmp_path}/none.db"):
        for command in (["inspect", db], ["best", db], ["show", db, "1"], ["report", db], ["train", db]):
            result = runner.invoke(app, command)
            assert result.exit_code == 2 and "no archive there" in result.output, (command, result.output)
    assert not (tmp_path / "none.db").exists()


def test_a_folder_given_as_the_archive_says_so(tmp_path):
    """`--db runs/` (a folder): the message said "check the URL and that the server is up"."""
    folder = tmp_path / "runs"
    folder.mkdir()
    with pytest.raises(ArchiveError) as caught:
        Archive(folder)
    assert str(caught.value) == f"{folder}: a folder, not an archive file; give a file such as {folder / 'runs.db'}"
    result = CliRunner().invoke(app, ["inspect", str(folder)])
    assert result.exit_code == 2 and "a folder, not an archive file" in result.output


def _inspect_through_read_only_view(folder: Path, name: str) -> subprocess.CompletedProcess:
    """`evolve inspect` on folder/name as a reader that may not write there: as root, through a read-only bind
    mount of the folder in a mount namespace of its own; otherwise with the folder and file made read-only."""
    inspect_cmd = [sys.executable, "-m", "evolve.cli", "inspect"]
    if os.geteuid() != 0:
        folder.chmod(0o555)
        (folder / name).chmod(0o444)
        try:
            return subprocess.run([*inspect_cmd, str(folder / name)], capture_output=True, text=True, timeout=120)
        finally:
            folder.chmod(0o755)
            (folder / name).chmod(0o644)
    view = folder.with_name(folder.name + "-view")
    view.mkdir(exist_ok=True)
    script = 'mount --bind "$1" "$2" && mount -o remount,bind,ro "$2" && shift 2 && exec "$@"'
    command = ["unshare", "-m", "sh", "-c", script, "sh", str(folder), str(view), *inspect_cmd, str(view / name)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_an_archive_on_a_read_only_mount_is_read_as_it_is_and_as_a_live_run_writes_it(tiny_search, tmp_path):
    """A finished run's archive on a read-only mount (or another user's folder) reads as it does where it is
    writable; while a writer holds rows in the WAL, the reader sees those too. SQLite had refused it: it could
    not make the -shm file it opens a WAL archive with ("unable to open database file")."""
    folder = tmp_path / "archive"
    folder.mkdir()
    db = tiny_search.copy_to(folder / "a.db")
    expected = subprocess.run(
        [sys.executable, "-m", "evolve.cli", "inspect", str(db)], capture_output=True, text=True, timeout=120
    )
    assert expected.returncode == 0 and expected.stdout.startswith(f"run {tiny_search.run_id} square"), expected

    finished = _inspect_through_read_only_view(folder, db.name)
    assert (finished.returncode, finished.stderr, finished.stdout) == (0, "", expected.stdout)
    assert sorted(p.name for p in folder.iterdir()) == ["a.db"]  # nothing left beside it

    writer = sqlite3.connect(db)
    try:
        writer.execute("PRAGMA journal_mode=WAL")
        writer.execute("PRAGMA wal_autocheckpoint=0")  # the change stays in a-db-wal, as a live run's do
        writer.execute("UPDATE runs SET problem_name = 'renamed-in-the-wal'")
        writer.commit()
        assert (folder / "a.db-wal").stat().st_size > 0
        live = _inspect_through_read_only_view(folder, db.name)
    finally:
        writer.close()
    assert live.returncode == 0, live.stderr
    assert live.stdout == expected.stdout.replace(" square ", " renamed-in-the-wal ", 1)


def test_a_file_name_with_a_question_mark_or_percent_is_that_file_and_odd_inputs_are_one_line(tmp_path, monkeypatch):
    """`--db 'x%41.db'` had opened xA.db (another archive: wrong data), `a?b.db` had made `a`; a file that is not
    a database, SQLITE:// in capitals and a name that is not UTF-8 had each given a traceback."""
    monkeypatch.chdir(tmp_path)
    for name in ("x%41.db", "a?b #c.db"):
        archive = Archive(name)
        run = archive.create_run("square", str(tmp_path), "fp", {}, 0)
        archive.close()
        reader = Archive(name, create=False)
        assert [r.id for r in reader.runs()] == [run.id] and reader.db.file == tmp_path / name
        reader.close()
    assert not (tmp_path / "xA.db").exists() and not (tmp_path / "a").exists()
    upper = Archive(f"SQLITE:///{tmp_path}/x%2541.db", create=False)  # the URL's own escape: the file x%41.db
    assert upper.db.file == tmp_path / "x%41.db" and len(upper.runs()) == 1
    upper.close()
    (tmp_path / "junk.db").write_bytes(bytes(range(256)) * 64)
    runner = CliRunner()
    result = runner.invoke(app, ["inspect", "junk.db"])
    assert result.exit_code == 2 and result.output.strip() == (
        f"error: sqlite:///{tmp_path}/junk.db: cannot open the archive (file is not a database); check that it is "
        "an archive file you may read"
    ), result.output
    weird = os.fsdecode(b"caf\xe9.db")
    result = runner.invoke(app, ["inspect", weird])
    assert result.exit_code == 2 and "the name is not valid UTF-8; rename the file" in result.output, result.output


def test_a_reader_that_may_not_write_sees_a_run_started_after_it_opened(tiny_search, tmp_path, monkeypatch):
    """`evolve serve` on a read-only view opened before a run wrote again: its immutable connection, pooled, had
    shown the old rows for good (and can read torn pages). Each session now opens its own connection."""
    from sqlalchemy import text

    import evolve.archive.database as database

    db = tiny_search.copy_to(tmp_path / "a.db")
    monkeypatch.setattr(database, "_may_write", lambda path: False)  # as through a read-only mount
    monkeypatch.setattr(database, "_may_create_beside", lambda path: False)
    reader = database.Database(db, create=False)
    assert reader.read_only

    def name() -> str:
        with reader.session() as s:
            return s.execute(text("SELECT problem_name FROM runs")).scalar()

    assert name() == "square"
    writer = sqlite3.connect(db)
    writer.execute("UPDATE runs SET problem_name = 'while-live'")
    writer.commit()
    assert (tmp_path / "a.db-wal").exists() and name() == "while-live"
    writer.execute("UPDATE runs SET problem_name = 'after-the-run'")
    writer.commit()
    writer.close()  # the last connection checkpoints the WAL into the file and removes it
    assert not (tmp_path / "a.db-wal").exists() and name() == "after-the-run"
    reader.close()


def test_a_wal_without_its_shm_in_a_read_only_folder_says_what_to_do(tiny_search, tmp_path, monkeypatch):
    import evolve.archive.database as database

    db = tiny_search.copy_to(tmp_path / "a.db")
    (tmp_path / "a.db-wal").write_bytes(b"")
    monkeypatch.setattr(database, "_may_write", lambda path: False)
    monkeypatch.setattr(database, "_may_create_beside", lambda path: False)
    with pytest.raises(ArchiveError) as caught:
        database.Database(db, create=False)
    assert str(caught.value) == (
        f"{db}: its a.db-wal is here but not its a.db-shm, and this folder is read-only, so the rows in the WAL "
        "cannot be read; copy a.db and a.db-wal to a folder you may write and open the copy"
    )
