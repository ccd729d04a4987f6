"""Malformed input ends a command in one line and a non-zero exit, never a traceback, and loses nothing
(issue 57, findings 11 and half of 8): an archive with damaged pages, a stored run config written over, an id
past what SQL holds, an in-memory database, a seed or worker count out of bounds, an archive folder that cannot
be made, and a SQLite file of something else, which the archive refuses instead of adding its tables to it."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.archive import Archive
from evolve.cli import app
from tests.helpers import KNOWN, square_run, store_program
from tests.report_run import replay_answers

DAMAGED = (
    "error: the archive {db} is damaged (database disk image is malformed); restore it from a copy, or recover "
    "what is left with `sqlite3 {db} .recover | sqlite3 recovered.db` and use recovered.db"
)
NO_SUCH_ID = "error: {name} 99999999999999999999: no such id; ids are whole numbers from 1 to 9223372036854775807"


def invoke(*args: str) -> tuple[int, list[str]]:
    """Run the real command line in process: its exit code and the lines it printed."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.output.strip().splitlines()


def make_archive(root: Path) -> Path:
    """A finished run of the square problem (a replay policy, so a resume loads no model) holding the known
    programs with their exact scores."""
    root.mkdir(parents=True, exist_ok=True)
    replay = root / "replay.json"
    replay.write_text(json.dumps(replay_answers()))
    _problem, archive, run, _options = square_run(root, policy=f"replay:{replay}", sandbox="process")
    for code, scores in KNOWN:
        evaluation = {"scores": scores, "scalar": sum(scores.values()) / 2, "duration_s": 0.1}
        store_program(archive, run.id, code, evaluation=evaluation)
    archive.update_run(run.id, status="finished")
    archive.close()
    with sqlite3.connect(root / "a.db") as con:  # every row in the file itself, none in its WAL
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return root / "a.db"


def known_rows(db: Path) -> list[tuple[str, str]]:
    """Each program's code and score vector, as stored."""
    with sqlite3.connect(db) as con:
        query = "SELECT p.code, e.scores FROM programs p JOIN evaluations e ON e.program_id = p.id ORDER BY p.id"
        return [(code, json.loads(scores)) for code, scores in con.execute(query)]


def test_the_known_programs_read_back_exactly(tmp_path: Path) -> None:
    """The archive the other tests break holds the known programs with their exact vectors, read by the CLI."""
    db = make_archive(tmp_path)
    assert known_rows(db) == [(code, scores) for code, scores in KNOWN]
    code, lines = invoke("best", db)
    assert code == 0 and "\n".join(lines) + "\n" == KNOWN[0][0]


def damage(db: Path, tables: tuple[str, ...] = ("programs", "evaluations")) -> None:
    """Overwrite the first page of each of `tables` with noise: the file still opens, its runs still read."""
    with sqlite3.connect(db) as con:
        size = con.execute("PRAGMA page_size").fetchone()[0]
        roots = dict(con.execute("SELECT name, rootpage FROM sqlite_master WHERE type = 'table'").fetchall())
    with db.open("r+b") as f:
        for table in tables:
            f.seek((roots[table] - 1) * size)
            f.write(b"\xa5" * size)


READERS = [  # every command that reads an archive, {db} its path and {out} a new path beside it
    ["inspect", "{db}"],
    ["report", "{db}"],
    ["report", "{db}", "--html", "{out}"],
    ["best", "{db}"],
    ["export", "{db}", "{out}"],
    ["show", "{db}", "1"],
]


@pytest.mark.parametrize("command", READERS, ids=lambda c: " ".join(c[:1] + c[2:3]))
def test_a_damaged_archive_is_one_line_and_left_as_it_was(tmp_path: Path, command: list[str]) -> None:
    db = make_archive(tmp_path)
    damage(db)
    before = db.read_bytes()
    code, lines = invoke(*(a.format(db=db, out=tmp_path / "out") for a in command))
    assert (code, lines) == (2, [DAMAGED.format(db=db)])
    assert db.read_bytes() == before  # a reader wrote nothing into it


def test_resuming_a_damaged_archive_stops_in_one_line(tmp_path: Path) -> None:
    db = make_archive(tmp_path)
    damage(db)
    code, lines = invoke("resume", db)
    assert code == 2
    assert (
        lines[-1]
        == DAMAGED.format(db=db).replace("error: ", "error: the run stopped: ", 1)
        + "; fix that, then run the same command to resume"
    )
    assert not any("Traceback" in line for line in lines)


UNREADABLE = "error: sqlite:///{db}: run 1's stored config cannot be read ({why}); restore the archive from a copy"
CONFIGS = {  # what a stored run config was written over with, and the line that says so
    "not JSON": (
        "'not json'",
        "error: the archive {db} is damaged (a stored JSON value does not parse: Expecting value: line 1 column 1 "
        "(char 0)); restore it from a copy",
    ),
    "not a table": ("'\"x\"'", UNREADABLE.replace("{why}", "it is not a table holding the tables problem and options")),
    "no problem": (
        "json_remove(config, '$.problem')",
        UNREADABLE.replace("{why}", "it is not a table holding the tables problem and options"),
    ),
    "fitness a string": (
        "json_set(config, '$.problem.fitness', 'bad')",
        UNREADABLE.replace(
            "{why}", "its problem's fitness table: Input should be a valid dictionary or instance of FitnessSection"
        ),
    ),
    "workers a string": (
        "json_set(config, '$.options.workers', 'many')",
        UNREADABLE.replace("{why}", "its option workers is 'many', not int"),
    ),
}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize(
    "command",
    [
        *READERS[:2],
        *READERS[3:5],
        ["train", "{db}"],
        ["resume", "{db}"],
        ["run", "{sq}", "--db", "{db}", "--sandbox", "process", "--allow-weak-sandbox"],  # resumes the latest run
    ],
    ids=lambda c: c[0],
)
def test_a_malformed_stored_run_config_is_one_line(tmp_path: Path, config: str, command: list[str]) -> None:
    db = make_archive(tmp_path)
    sql, said = CONFIGS[config]
    with sqlite3.connect(db) as con:
        con.execute(f"UPDATE runs SET config = {sql}")
    before = db.read_bytes()
    code, lines = invoke(*(a.format(db=db, out=tmp_path / "out", sq=tmp_path / "sq") for a in command))
    assert (code, lines) == (2, [said.format(db=db)])
    assert db.read_bytes() == before and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "args, name",
    [
        (["show", "{db}", "99999999999999999999"], "PROGRAM_ID"),
        (["report", "{db}", "--run", "99999999999999999999"], "--run"),
        (["resume", "{db}", "--run", "99999999999999999999"], "--run"),
    ],
)
def test_an_id_past_what_sql_holds_is_one_line(tmp_path: Path, args: list[str], name: str) -> None:
    db = make_archive(tmp_path)
    code, lines = invoke(*(a.format(db=db) for a in args))
    assert (code, lines) == (2, [NO_SUCH_ID.format(name=name)])
    code, lines = invoke("show", db, "1")  # the archive still answers
    assert code == 0 and lines[0] == "program 1 run 1, island 0, generation 0, parent None"


@pytest.mark.parametrize("url", ["sqlite:///:memory:", "sqlite://"])
def test_an_in_memory_database_is_refused_in_one_line(tmp_path: Path, url: str) -> None:
    db = make_archive(tmp_path)
    said = (
        f"error: --db {url}: an in-memory database is empty to every connection but the one that wrote it, and gone "
        "when the command ends; give a file path (runs/NAME.db) or a server's URL"
    )
    folder = tmp_path / "sq"
    assert invoke("run", folder, "--db", url, "--sandbox", "process", "--allow-weak-sandbox") == (2, [said])
    assert invoke("inspect", url) == (2, [said])
    assert known_rows(db) == [(c, s) for c, s in KNOWN]


@pytest.mark.parametrize(
    "flag, value, said",
    [
        ("--seed", "-1", "--seed -1: give a value from 0 to 9223372036854775807"),
        ("--seed", "9223372036854775808", "--seed 9223372036854775808: give a value from 0 to 9223372036854775807"),
        ("--workers", "100000", "--workers 100000: give a value from 1 to 1024"),
        ("--group-size", "99999999999999999999", "--group-size 99999999999999999999: give a value from 1 to 1024"),
        ("--max-new-tokens", "10000000", "--max-new-tokens 10000000: give a value from 16 to 131072"),
        (
            "--patience",
            "99999999999999999999",
            "--patience 99999999999999999999: give a value from 1 to 9223372036854775807",
        ),
        ("--recent-children", "100000", "--recent-children 100000: give a value from 0 to 64"),
    ],
)
def test_a_flag_out_of_bounds_is_one_line_and_starts_nothing(tmp_path: Path, flag: str, value: str, said: str) -> None:
    db = make_archive(tmp_path)
    before = db.read_bytes()
    assert invoke("run", tmp_path / "sq", "--db", db, flag, value) == (2, [f"error: {said}"])
    if flag == "--workers":  # a flag of `evolve resume` too
        assert invoke("resume", db, flag, value) == (2, [f"error: {said}"])
    assert db.read_bytes() == before


def test_an_archive_folder_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    make_archive(tmp_path)
    (tmp_path / "a-file").write_text("not a folder\n")
    db = tmp_path / "a-file" / "runs" / "x.db"
    code, lines = invoke("run", tmp_path / "sq", "--db", db, "--sandbox", "process", "--allow-weak-sandbox")
    assert (code, lines) == (
        2,
        [
            f"error: {db}: cannot make the archive's folder {db.parent} ({tmp_path / 'a-file'} is a file, not a "
            "folder); give --db a path in a folder you may write"
        ],
    )
    assert (tmp_path / "a-file").read_text() == "not a folder\n"


def foreign_file(path: Path, journal: str) -> sqlite3.Connection:
    """A SQLite file of another program (a table `notes` with one row), and its connection, left open: in WAL
    mode its -wal file stays beside it while the other program runs."""
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA journal_mode = {journal}")
    con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    con.execute("INSERT INTO notes (text) VALUES ('keep me')")
    con.commit()
    return con


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_a_sqlite_file_of_something_else_is_refused_and_left_as_it_was(tmp_path: Path, journal: str) -> None:
    make_archive(tmp_path)
    db = tmp_path / "notes.db"
    other = foreign_file(db, journal)
    files = sorted(p.name for p in tmp_path.glob("notes.db*"))
    before = db.read_bytes()
    said = (
        f"error: sqlite:///{db}: not an archive: it holds tables of something else (notes); give --db a new file or "
        "an archive of evolve's"
    )
    folder = tmp_path / "sq"
    assert invoke("run", folder, "--db", db, "--sandbox", "process", "--allow-weak-sandbox") == (2, [said])
    assert invoke("inspect", db) == (2, [said])
    assert db.read_bytes() == before  # no table added, its journal mode as it was
    assert sorted(p.name for p in tmp_path.glob("notes.db*")) == files
    assert other.execute("PRAGMA journal_mode").fetchone() == (journal,)
    assert other.execute("SELECT name FROM sqlite_master").fetchall() == [("notes",)]
    assert other.execute("SELECT id, text FROM notes").fetchall() == [(1, "keep me")]
    other.close()


def test_an_empty_file_a_new_file_and_archives_of_every_schema_still_open(tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy import create_engine

    from evolve.archive.database import MIGRATIONS

    (tmp_path / "empty.db").touch()
    for path in (tmp_path / "empty.db", tmp_path / "new" / "new.db"):
        Archive(path).close()
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    revisions = [r.revision for r in ScriptDirectory.from_config(cfg).walk_revisions()]
    assert len(revisions) >= 7
    for revision in revisions:  # an archive made by each earlier version, brought to head when opened
        old = tmp_path / f"old-{revision}.db"
        engine = create_engine(f"sqlite:///{old}")
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)
        engine.dispose()
        Archive(old).close()
    db = make_archive(tmp_path / "own")
    shutil.copy(db, tmp_path / "copy.db")
    code, lines = invoke("inspect", tmp_path / "copy.db")
    assert code == 0 and lines[0].startswith("run 1 square (finished, ")


NOT_OURS = (
    "error: sqlite:///{db}: not an archive: it holds {what} but no schema version of evolve's (an alembic_version "
    "table holding one of its revisions); give --db a new file or an archive of evolve's"
)
LOOKALIKES = {  # another program's SQLite file with nothing but the archive's own names, or no table at all
    "a table named runs": ("CREATE TABLE runs (id INT)", "table runs"),
    "only a view": ("CREATE VIEW v AS SELECT 1 AS one", "view v"),
    "an index and a trigger": (
        "CREATE TABLE runs (id INT); CREATE INDEX ix_mine ON runs (id); "
        "CREATE TRIGGER t AFTER INSERT ON runs BEGIN SELECT 1; END",
        "table runs, index ix_mine, trigger t",
    ),
    "an empty alembic_version": (
        "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL); CREATE TABLE programs (id INT)",
        "table alembic_version, table programs",
    ),
}


@pytest.mark.parametrize("lookalike", list(LOOKALIKES))
def test_a_sqlite_file_with_only_archive_names_is_refused_and_left_as_it_was(tmp_path: Path, lookalike: str) -> None:
    """Tables named as the archive's, a view, an index or a trigger make a database someone else's unless it holds
    the archive's schema version: no alembic_version (nor any table) is added to it, and the real archive reads."""
    archive = make_archive(tmp_path)
    db = tmp_path / "other.db"
    sql, what = LOOKALIKES[lookalike]
    with sqlite3.connect(db) as con:
        con.executescript(sql)
    con.close()
    before = db.read_bytes()
    said = NOT_OURS.format(db=db, what=what)
    folder = tmp_path / "sq"
    assert invoke("run", folder, "--db", db, "--sandbox", "process", "--allow-weak-sandbox") == (2, [said])
    assert invoke("inspect", db) == (2, [said])
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.glob("other.db*")) == ["other.db"]
    assert known_rows(archive) == [(c, s) for c, s in KNOWN]
    code, lines = invoke("best", archive)
    assert code == 0 and "\n".join(lines) + "\n" == KNOWN[0][0]


BAD_TIME = "error: the archive {db} is damaged (a stored time does not parse: 'notadate'); restore it from a copy"


TIME_READS = [  # a command, and a table whose stored time it reads as a time
    (["show", "{db}", "1"], "programs"),
    (["best", "{db}"], "programs"),
    (["export", "{db}", "{out}"], "evaluations"),
    (["report", "{db}"], "programs"),
    (["inspect", "{db}"], "runs"),
    (["resume", "{db}"], "runs"),
]


@pytest.mark.parametrize("command, table", TIME_READS, ids=lambda c: c if isinstance(c, str) else c[0])
def test_a_malformed_stored_time_is_one_line_and_left_as_it_was(tmp_path: Path, command: list[str], table: str) -> None:
    """A stored time written over by hand is the archive's damage, said in one line like any other, never a
    `ValueError` traceback; once the time is put right, the known programs read back exactly."""
    db = make_archive(tmp_path)
    with sqlite3.connect(db) as con:
        con.execute(f"UPDATE {table} SET created_at = 'notadate'")
        con.commit()
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the damage in the file itself, none of it in its WAL
    con.close()
    before = db.read_bytes()
    code, lines = invoke(*(a.format(db=db, out=tmp_path / "out") for a in command))
    assert (code, lines) == (2, [BAD_TIME.format(db=db)])
    assert db.read_bytes() == before and not (tmp_path / "out").exists()
    with sqlite3.connect(db) as con:
        con.execute(f"UPDATE {table} SET created_at = '2024-01-01 00:00:00'")
    con.close()
    assert known_rows(db) == [(c, s) for c, s in KNOWN]
    code, lines = invoke("best", db)
    assert code == 0 and "\n".join(lines) + "\n" == KNOWN[0][0]


@pytest.mark.parametrize(
    "url, part",
    [
        ("sqlite:///{root}/%00x.db", "file path"),
        ("sqlite:///{root}/x.db?mode=r%00w", "query"),
        ("postgresql+psycopg://u%00ser@localhost/db", "user name"),
    ],
)
def test_a_nul_byte_in_the_db_url_is_one_line(tmp_path: Path, url: str, part: str) -> None:
    archive = make_archive(tmp_path / "own")
    given = url.format(root=tmp_path)
    said = f"error: --db {given}: its {part} holds a NUL byte (%00), which no name may hold; write the URL without it"
    folder = tmp_path / "own" / "sq"
    assert invoke("run", folder, "--db", given, "--sandbox", "process", "--allow-weak-sandbox") == (2, [said])
    assert invoke("inspect", given) == (2, [said])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own"]
    assert known_rows(archive) == [(c, s) for c, s in KNOWN]
