"""One live session per problem in an archive (evolve/archive/session_lock.py): a second `evolve run` of a run that
a live process runs is refused and writes nothing; a `kill -9` frees it at once for the resume."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import time

import pytest
from sqlalchemy import text

from evolve.archive import Archive, SessionBusy, SessionLock
from tests.forked_cli import FORKED
from tests.helpers import evolve_run_cmd, write_square_problem
from tests.report_run import _variant


def _slow_answers(n: int) -> list[str]:
    """Distinct programs (no duplicates: the run keeps going) that each take a moment to score. The resume scores
    every child the killed run had queued (about twenty) before its own group: a longer moment costs twentyfold."""
    body = "def solve(x):\n    import time\n    time.sleep(0.1)\n    return x * x + {i} - {i}\n"
    return [_variant(1, body.format(i=i)) + _variant(2, body.format(i=1000 + i)) for i in range(60)]


def _rows(db, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as con:
        return con.execute(sql).fetchall()


def test_a_second_run_of_a_live_run_is_refused_and_a_killed_one_resumes_at_once(tmp_path):
    folder = write_square_problem(tmp_path / "square")
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps(_slow_answers(60)))
    db = tmp_path / "runs.db"
    cmd = evolve_run_cmd(folder, db, f"replay:{replay}", 500, "--workers", "1", "--group-size", "2")
    first = FORKED.spawn(cmd[3:])  # each run a process of its own, forked from one that imported the CLI once
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and first.poll() is None:
            try:
                if _rows(db, "SELECT COUNT(*) FROM evaluations")[0][0] >= 3:
                    break
            except sqlite3.OperationalError:  # not made yet
                pass
            time.sleep(0.2)
        assert first.poll() is None, first.wait()
        # The same command again, with a group budget the run has already spent: without the lock it resumed the
        # live run beside its owner (and here stopped at once, exit 0, an interruption counted that never was).
        second = FORKED.run([*cmd[3:], "--max-groups", "1"], timeout=120)  # a process of its own, as `evolve run`
        assert second.returncode == 2, second.stdout[-1000:] + second.stderr[-1000:]
        assert f"square is being run there now by process {first.pid};" in second.stderr
        assert len(second.stderr.strip().splitlines()) == 1
        (state,) = _rows(db, "SELECT state FROM runs")[0]
        assert json.loads(state).get("interruptions", 0) == 0
        assert "overrides" not in json.loads(_rows(db, "SELECT config FROM runs")[0][0])
    finally:
        first.kill()  # SIGKILL
        first.wait()
    groups = _rows(db, "SELECT COUNT(*) FROM prompts")[0][0]
    resume = ["resume", str(db), "--max-groups", str(groups + 1)]
    resumed = FORKED.run(resume, timeout=300)  # at once: the kernel freed it
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "was interrupted (its process was killed)" in resumed.stdout
    assert json.loads(_rows(db, "SELECT state FROM runs")[0][0]).get("interruptions") == 1
    assert _rows(db, "SELECT COUNT(*) FROM prompts")[0][0] == groups + 1


def test_the_lock_is_held_until_released_and_per_problem(db_url):
    """On each database: a second holder of one problem is refused, another problem is not, and a release lets
    the next in (PostgreSQL: a session advisory lock on a connection of its own)."""
    linked = None
    if not db_url.startswith("postgresql"):  # the same file through a symlink is the same archive
        linked = os.path.join(os.path.dirname(db_url), "link.db")
        Archive(db_url).close()
        os.symlink(db_url, linked)
    archive, other = Archive(db_url), Archive(linked or db_url)
    try:
        held = SessionLock(archive.db, "square").acquire()
        with pytest.raises(SessionBusy, match="square is being run there now by"):
            SessionLock(other.db, "square").acquire()
        beside = SessionLock(other.db, "circles").acquire()
        held.release()
        again = SessionLock(other.db, "square").acquire()
        again.release()
        beside.release()
        held.release()  # twice is harmless
    finally:
        archive.close()
        other.close()
    if archive.db.file is not None:
        (lock,) = archive.db.file.parent.glob(f"{archive.db.file.name}-square-*.lock")
        assert lock.read_text() == f"{os.getpid()}\n"


def test_names_that_look_alike_in_a_file_name_are_different_problems(tmp_path):
    """The lock file's name keeps a readable part of the problem's name and a hash of all of it: "sq uare" and
    "sq_uare", or two names of characters a file name drops, are two problems (they were one lock)."""
    archive = Archive(tmp_path / "a.db")
    try:
        pairs = [("sq uare", "sq_uare"), ("平方", "立方"), ("p" * 90 + "a", "p" * 90 + "b")]
        held = [SessionLock(archive.db, name).acquire() for pair in pairs for name in pair]
        for lock in held:
            lock.release()
    finally:
        archive.close()


def _lose(db_url: str, lock: SessionLock) -> None:
    """Take the lock away from its live holder: its file deleted, or its server connection ended."""
    if lock._path is not None:
        lock._path.unlink()
        return
    pid = lock._connection.execute(text("SELECT pg_backend_pid()")).scalar()
    killer = Archive(db_url)
    try:
        with killer.db.engine.connect() as con:  # waits for the backend to end (its locks end with it)
            assert con.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid}).scalar()
    finally:
        killer.close()


def test_a_lock_lost_under_its_holder_is_taken_again_or_its_holder_told_to_stop(db_url):
    """Its file deleted by hand, or its connection ended by the server: the holder's next `keep` takes it again
    (and a second session is refused after that); where a second session got in first, `keep` says this one stops."""
    first, second = Archive(db_url), Archive(db_url)
    try:
        holder = SessionLock(first.db, "square").acquire()
        _lose(db_url, holder)
        assert holder.keep() is None
        with pytest.raises(SessionBusy):
            SessionLock(second.db, "square").acquire()
        _lose(db_url, holder)
        other = SessionLock(second.db, "square").acquire()  # in before the holder's next save
        lost = holder.keep()
        assert lost is not None and lost.startswith("lost the session lock, and another process took it:")
        other.release()
        holder.release()
    finally:
        first.close()
        second.close()


def test_a_run_whose_lock_another_session_took_stops_with_that_line(tmp_path):
    """The loop asks `keep_session` with every state save; a line back stops the run at once (status `stopped`,
    queued children left pending for whoever holds the lock now)."""
    from evolve.loop import SearchLoop, run_search
    from policies.replay import ReplayPolicy
    from sandboxes.process import ProcessSandbox
    from tests.helpers import square_run

    problem, archive, run, options = square_run(tmp_path, max_evaluations=40)
    loop = SearchLoop(problem, archive, ReplayPolicy(_slow_answers(60)), ProcessSandbox(1), run, options)
    loop.save_every_s = 0.2
    asked: list[float] = []

    def keep() -> str | None:
        asked.append(time.monotonic())
        return "lost the session lock, and another process took it: (test)" if len(asked) >= 3 else None

    loop.keep_session = keep
    try:
        reason = run_search(loop)
    finally:
        archive.close()
    assert reason == "stopped: lost the session lock, and another process took it: (test)"
    assert len(asked) >= 3
    assert _rows(tmp_path / "a.db", "SELECT status FROM runs") == [("stopped",)]


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder immutable (chattr +i) needs root")
def test_a_lock_that_cannot_be_retaken_yet_is_retaken_at_a_later_save(tmp_path):
    """Its file deleted while the folder refuses new files (immutable here): `keep` cannot retake it and says
    nothing (the folder, not another session, is in the way); once the folder takes files again, the next `keep`
    holds it, and a second session is refused again."""
    folder = tmp_path / "runs"
    folder.mkdir()
    archive = Archive(folder / "a.db")
    holder = SessionLock(archive.db, "square").acquire()
    try:
        holder._path.unlink()
        if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("this filesystem has no immutable attribute")
        try:
            assert holder.keep() is None and not holder._path.exists()
        finally:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        assert holder.keep() is None and holder._path.exists()
        with pytest.raises(SessionBusy):
            SessionLock(archive.db, "square").acquire()
    finally:
        holder.release()
        archive.close()
