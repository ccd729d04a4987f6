"""Local users attacking root's files (issue #57, second red-team round, findings 19 to 22).

Each attack is made for real by an unprivileged account this module makes (and removes): a process forked from the
test that drops to that account plants a link, makes a folder first or holds a lock, exactly as a local user
could. Root's engine then works on: a known program scores its exact vector, and the planted file is unchanged.
The shared folder is a fresh one with /tmp's mode (1777), so that nothing of the machine's own /tmp is touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from evolve.archive import Archive
from tests.helpers import KNOWN, assert_known_vectors, db_rows, evolve_run_cmd, hiding_sandbox, write_problem
from tests.local_accounts import User, account

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="making a second account and acting as it needs root")

# A completion of three variants, each a known program (the seed, x * x, is the fourth).
ANSWERS = "".join(
    f"<variant {k}>\n```python\n# EVOLVE-BLOCK-START\n{code}# EVOLVE-BLOCK-END\n```\n</variant {k}>\n"
    for k, (code, _) in enumerate(KNOWN[1:], start=1)
)


@pytest.fixture(scope="module")
def mallory() -> Iterator[User]:
    with account(f"evlu-m{os.getpid()}") as user:
        yield user


@pytest.fixture(scope="module")
def bob() -> Iterator[User]:
    """A second unprivileged account: an engine of a user's own, beside mallory."""
    with account(f"evlu-b{os.getpid()}") as user:
        yield user


@pytest.fixture
def shared() -> Iterator[Path]:
    """A folder every user may write in, sticky: a /tmp of the test's own."""
    folder = Path(tempfile.mkdtemp(prefix="vpo-lu-shared-", dir="/tmp"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    from evolve.problem import load_problem

    return load_problem(write_problem(tmp_path_factory.mktemp("local_users"), timeout=3.0))


def _run(folder: Path, db: Path, replay: Path) -> subprocess.CompletedProcess:
    cmd = evolve_run_cmd(folder, db, f"replay:{replay}", 4)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)


def _assert_known_vectors_stored(db: Path) -> None:
    """The run's four programs (the seed and the three answers) were scored and stored with their exact vectors."""
    rows = db_rows(db, "SELECT p.code, e.scores FROM programs p JOIN evaluations e ON e.program_id = p.id")
    got = {next(c for c, _ in KNOWN if c.splitlines()[1] in code): json.loads(scores) for code, scores in rows}
    assert got == {code: want for code, want in KNOWN}, rows


def _run_parts(tmp_path: Path) -> tuple[Path, Path]:
    folder = write_problem(tmp_path / "prob", timeout=3.0)
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([ANSWERS]))
    return folder, replay


def _lock_name(db: Path, problem_name: str = "t") -> Path:
    return db.with_name(f"{db.name}-{problem_name}-{hashlib.sha256(problem_name.encode()).hexdigest()[:12]}.lock")


# ---- finding 22: a name made first in a shared temp folder ---------------------------------------------------
@pytest.mark.parametrize("kind", ["process", "docker"])
def test_a_folder_a_user_made_first_in_the_temp_folder_does_not_stop_roots_sandbox(
    kind, mallory, shared, problem, monkeypatch
):
    """Root's engine kept the empty file it binds over the host's configuration in TEMP/vpo-evolve-empty-0: a user
    who made that folder first had every job of root's refused. Root's folder is now root's own, under /run."""
    from sandboxes.host_config import hidden_host_config

    if not hidden_host_config():
        pytest.skip("this host has no /usr/local/etc nor /usr/etc: no empty file is bound over anything")
    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.setenv("TMPDIR", str(shared))
    planted = shared / "vpo-evolve-empty-0"
    mallory.run(lambda: os.mkdir(planted, 0o700))
    box = hiding_sandbox(kind, slots=1)
    try:
        assert_known_vectors(box, problem)
    finally:
        box.close()  # type: ignore[attr-defined]
    assert os.lstat(planted).st_uid == mallory.uid and os.listdir(planted) == []


def test_a_users_engine_gets_a_folder_of_its_own_when_another_user_took_its_name(mallory, bob, shared, monkeypatch):
    """A user's engine keeps the empty file in TEMP/vpo-evolve-empty-UID: where another user made that first, it was
    refused ("not a private folder"); now it makes a folder of unpredictable name for itself instead."""
    from sandboxes.host_config import empty_file

    monkeypatch.setattr(tempfile, "tempdir", str(shared))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    planted = shared / f"vpo-evolve-empty-{bob.uid}"
    mallory.run(lambda: os.mkdir(planted, 0o755))

    def make() -> dict:
        path = empty_file()
        info = os.lstat(path)
        folder = os.lstat(os.path.dirname(path))
        return {
            "path": path,
            "uid": info.st_uid,
            "mode": stat.S_IMODE(info.st_mode),
            "size": info.st_size,
            "folder": [folder.st_uid, stat.S_IMODE(folder.st_mode)],
            "again": empty_file() == path,
        }

    made = bob.run(make)
    assert not made["path"].startswith(str(planted) + "/"), made
    assert (made["uid"], made["mode"], made["size"], made["folder"], made["again"]) == (
        bob.uid,
        0o444,
        0,
        [bob.uid, 0o700],
        True,
    ), made
    assert os.lstat(planted).st_uid == mallory.uid and os.listdir(planted) == []


# ---- finding 19: a problem folder planted for root's Ray actor ---------------------------------------------------
# Run as root in a mount namespace of its own with a fresh /tmp (so the machine's is not touched); argv: uid, gid.
# The Ray object store is stood in for by the bundle's bytes themselves (ray.get hands them back): what is tested is
# which folder the actor loads a problem from.
RAY_VICTIM = r"""
import json, os, shutil, sys, types
from pathlib import Path
sys.modules["ray"] = types.SimpleNamespace(get=lambda ref: ref)
from evolve.problem import load_problem
from evolve.problem.samples import write_problem
from sandboxes.process import ProcessSandbox
from sandboxes.ray_pool import Evaluator, pack_folder
from tests.helpers import KNOWN

uid, gid = int(sys.argv[1]), int(sys.argv[2])
src = write_problem(Path("/tmp/src"), timeout=3.0)
for where, folders, files in os.walk("/tmp/src"):
    for name in [".", *folders, *files]:
        os.chmod(os.path.join(where, name), 0o755)
fp = load_problem(src).fingerprint()
planted = Path("/tmp/vpo-evolve-ray-problems") / fp
CHEAT = '''import os
open("/tmp/PWNED", "w").write(str(os.getuid()))
def cases():
    return [{"name": "c0", "input": 2, "expected": 4}, {"name": "c1", "input": 3, "expected": 9}]
def score(case, output):
    return 1.0, "planted"
'''
pid = os.fork()
if pid == 0:
    os.setgroups([]); os.setgid(gid); os.setuid(uid)
    shutil.copytree(src, planted)
    (planted / "evaluate.py").write_text(CHEAT)
    os.chmod(planted.parent, 0o777)
    os._exit(0)
os.waitpid(pid, 0)
before = {p.name: p.read_bytes().hex() for p in planted.iterdir()}
bundle = [pack_folder(src)]
said = {}
for label, root in (("missing here", "/nonexistent/on/this/node"), ("a user's folder here", str(planted))):
    actor = Evaluator(lambda: ProcessSandbox(slots=1))
    try:
        outcomes = [actor.evaluate(fp, root, bundle, code) for code, _ in KNOWN]
        loaded = actor.problems[fp].root
    finally:
        actor.sandbox.close()
    info = os.stat(loaded.parent)
    said[label] = {
        "vectors": [o.scores for o in outcomes],
        "loaded": str(loaded),
        "folder": [info.st_uid, info.st_mode & 0o777],
        "pwned": open("/tmp/PWNED").read() if os.path.exists("/tmp/PWNED") else None,
    }
said["planted unchanged"] = before == {p.name: p.read_bytes().hex() for p in planted.iterdir()}
print(json.dumps(said))
"""


def test_a_problem_folder_a_user_planted_is_never_loaded_by_roots_ray_actor(mallory):
    """A Ray actor on a node without the engine's problem folder unpacked it in /tmp/vpo-evolve-ray-problems/FP and
    loaded whatever was there: a user who made that folder first (the fingerprint is computable from the public
    problem files) had her evaluator run as root. A folder at the engine's own path, made by a user on a node that
    lacked it, was loaded too. Now neither is: the actor unpacks into root's private folder under /run."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is missing: no private /tmp for this test")
    # A private, empty /tmp; the checkout is carried over to its own path in it, wherever it lives (a clone under
    # /tmp would vanish with the host's /tmp, and the engine with it)
    mount = (
        'mount --bind "$CHECKOUT" /mnt && mount -t tmpfs -o mode=1777 tmpfs /tmp && mkdir -p "$CHECKOUT" '
        '&& mount --move /mnt "$CHECKOUT" && exec "$0" "$@"'
    )
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, sys.executable, "-c", RAY_VICTIM]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CHECKOUT": str(ROOT)}
    done = subprocess.run(
        [*cmd, str(mallory.uid), str(mallory.gid)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads(done.stdout.strip().splitlines()[-1])
    for label in ("missing here", "a user's folder here"):
        got = said[label]
        assert got["pwned"] is None, (label, got)
        assert got["vectors"] == [want for _, want in KNOWN], (label, got)
        assert got["loaded"].startswith("/run/vpo-evolve-ray-problems/") and got["folder"] == [0, 0o700], got
    assert said["planted unchanged"]


# ---- finding 20: the session lock's predictable name --------------------------------------------------------------
def test_a_link_planted_at_the_session_locks_name_is_refused_and_its_target_kept(mallory, shared, tmp_path):
    """A user linked `<archive>-<problem>-<hash>.lock` beside root's archive in a shared folder to a root-only file:
    root's `evolve run` truncated that file and wrote its pid in it. Now the run stops with one line, exit 2."""
    folder, replay = _run_parts(tmp_path)
    target = tmp_path / "precious"
    target.write_text("root's own, not to be touched\n")
    target.chmod(0o600)
    db = shared / "shared.db"
    lock = _lock_name(db)
    mallory.run(lambda: os.symlink(target, lock))
    refused = _run(folder, db, replay)
    assert refused.returncode == 2, refused.stdout[-1500:] + refused.stderr[-1500:]
    assert refused.stderr.strip().splitlines() == [
        f"error: {lock}: a symbolic link where the run's lock file belongs; remove it"
    ], refused.stderr
    assert target.read_text() == "root's own, not to be touched\n" and stat.S_IMODE(target.stat().st_mode) == 0o600
    lock.unlink()
    done = _run(folder, db, replay)
    assert done.returncode == 0, done.stderr[-2000:]
    _assert_known_vectors_stored(db)


def test_a_lock_held_by_another_users_process_names_it_and_is_never_written(mallory, shared, tmp_path):
    """A user who made the lock file first, holds its flock and wrote "1" in it had root's run refused "by process
    1". The refusal names the process the kernel says holds it, and its user; root never writes in her file."""
    folder, replay = _run_parts(tmp_path)
    db = shared / "shared.db"
    lock = _lock_name(db)

    def hold() -> int:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        os.write(fd, b"1\n")
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    with mallory.holding(hold) as holder:
        refused = _run(folder, db, replay)
    assert refused.returncode == 2, refused.stdout[-1500:] + refused.stderr[-1500:]
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert f"t is being run there now by process {holder} of user {mallory.name};" in refused.stderr
    done = _run(folder, db, replay)  # she let go: the run goes on
    assert done.returncode == 0, done.stderr[-2000:]
    _assert_known_vectors_stored(db)
    assert lock.read_bytes() == b"1\n" and lock.stat().st_uid == mallory.uid


# ---- finding 21: archives readable (and lockable) by every user -------------------------------------------------
def test_a_new_archive_and_its_wal_and_shm_are_its_users_alone(mallory, shared, tmp_path):
    """Archives were made 0644 (and SQLite gives the -wal and -shm the file's mode): any user read every prompt and
    program, and could lock the -shm. Now a new archive is 0600, whatever the umask."""
    old = os.umask(0)  # the most open umask: the archive is 0600 all the same
    try:
        archive = Archive(shared / "new.db")
    finally:
        os.umask(old)
    try:
        with archive.db.session() as s:  # a write: the -wal and -shm are made
            s.execute(text("CREATE TABLE IF NOT EXISTS probe (x)"))
        made = {p.name: stat.S_IMODE(p.stat().st_mode) for p in shared.glob("new.db*")}
        assert made == {"new.db": 0o600, "new.db-wal": 0o600, "new.db-shm": 0o600}, made
        with pytest.raises(AssertionError, match="PermissionError"):
            mallory.run(lambda: os.open(shared / "new.db-shm", os.O_RDONLY))
    finally:
        archive.close()


def test_a_run_waiting_on_another_users_lock_says_so_and_goes_on_when_it_is_let_go(mallory, shared, tmp_path):
    """An archive others may read (made before, or shared on purpose): a user with a read-only descriptor of its
    -shm held a shared lock on SQLite's WAL write-lock byte, and root's run stopped writing for 120 s without a
    word. Now the run says, within seconds, which file and which process; it goes on once the lock is let go."""
    folder, replay = _run_parts(tmp_path)
    db = shared / "open.db"
    Archive(db).close()
    for path in shared.glob("open.db*"):
        path.chmod(0o644)
    reader = sqlite3.connect(db)  # keeps the -shm there for her to open
    reader.execute("SELECT count(*) FROM runs").fetchall()
    shm = db.with_name("open.db-shm")
    assert stat.S_IMODE(shm.stat().st_mode) == 0o644

    def hold() -> int:
        fd = os.open(shm, os.O_RDONLY)
        fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 120)
        return fd

    lines: list[str] = []
    try:
        with mallory.holding(hold) as holder:
            run = subprocess.Popen(
                evolve_run_cmd(folder, db, f"replay:{replay}", 4),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                cwd=ROOT,
            )
            reading = threading.Thread(target=lambda: lines.extend(iter(run.stderr.readline, "")), daemon=True)
            reading.start()
            deadline = time.monotonic() + 25
            while time.monotonic() < deadline and not any(str(shm) in line for line in lines):
                time.sleep(0.2)
            said = [line for line in lines if str(shm) in line]
        run.wait(timeout=120)
        reading.join(timeout=10)
    finally:
        reader.close()
        with contextlib.suppress(ProcessLookupError, NameError):
            run.kill()
    assert said, lines
    assert len(said) == 1 and f"held by process {holder} of user {mallory.name}" in said[0], said
    assert run.returncode == 0, lines[-20:]
    _assert_known_vectors_stored(db)
