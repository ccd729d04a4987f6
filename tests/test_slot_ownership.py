"""The process sandbox ends only what it started: a slot uid is one engine's alone, machine-wide (issue #57, 6).

A root engine runs each job as its slot's uid and sweeps that uid afterwards. Before, the sweep killed every
process of the uid on the machine (a user's `sleep` run as uid 61000 died of a 2-evaluation run), and the slot
locks lived under TMPDIR (two root engines with different TMPDIRs both took slot 0, and each one's sweep killed
the other's candidates: `crash: no reply (signal SIGKILL)`). Each engine here is a process of its own, as in a
real run; the processes it must leave alone are the test's children, not the engine's. Every run here ends with
the engines' exact vectors for known programs.
"""

from __future__ import annotations

import ast
import grp
import json
import os
import pwd
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandboxes.sandbox import SandboxRefused
from tests.helpers import KNOWN, assert_known_vectors, reported, write_problem

ROOT = Path(__file__).resolve().parents[1]
BASE_UID = 61000
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only a root engine runs candidates as slot uids")

# An engine in a process of its own: says its slot uids, waits for a line on stdin, evaluates the programs in
# argv[3] (a JSON list), and says each outcome and its slot uids again.
ENGINE = """
import json, sys
from evolve.problem import load_problem
from sandboxes.process import ProcessSandbox
problem = load_problem(sys.argv[1])
box = ProcessSandbox(slots=int(sys.argv[2]))
print(json.dumps({"uids": list(box.slot_uids)}), flush=True)
sys.stdin.readline()
out = [box.evaluate(problem, code) for code in json.loads(sys.argv[3])]
said = [{"scores": o.scores, "error": o.error, "feedback": o.feedback} for o in out]
print(json.dumps({"outcomes": said, "uids": list(box.slot_uids)}), flush=True)
box.close()
"""
WHO = "import os\ndef solve(x):\n    return os.getuid()\n"  # c0 echoes what it returned: the uid the job ran as
# Each known program, slowed so that two engines' jobs surely overlap.
SLOW_KNOWN = [("import time\n" + code.replace(":\n", ":\n    time.sleep(0.25)\n", 1), want) for code, want in KNOWN]


class Engine:
    """One engine process (sandboxes/process.py in this checkout), started with its own environment."""

    def __init__(self, problem: Path, programs: list[str], slots: int = 1, env: dict[str, str] | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ENGINE, str(problem), str(slots), json.dumps(programs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        )
        self.uids = self._line()["uids"]

    def _line(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(timeout=30)
            assert self.proc.stderr is not None
            raise AssertionError(f"the engine ended (exit {self.proc.returncode}): {self.proc.stderr.read()[-800:]}")
        return json.loads(line)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def results(self) -> dict:
        found = self._line()
        self.proc.wait(timeout=60)
        return found

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _reported(outcome: dict) -> object:
    for line in (outcome["feedback"] or "").splitlines():
        if line.startswith("c0: "):
            return ast.literal_eval(line[4:])
    raise AssertionError(f"no report: {outcome['error']} {outcome['feedback']}")


def _exact(outcomes: list[dict], known: list = KNOWN) -> None:
    """Each outcome is exactly its known program's vector (the errors are shown where one is not)."""
    assert [o["scores"] for o in outcomes] == [want for _, want in known], [(o["scores"], o["error"]) for o in outcomes]


def _uids_of(pid: int | str) -> set[int]:
    """A process's real, effective, saved and filesystem uids (not its /proc folder's owner)."""
    text = Path(f"/proc/{pid}/status").read_text()
    return {int(u) for u in text.split("\nUid:", 1)[1].split("\n", 1)[0].split()}


def _running_as(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if uid in _uids_of(entry.name) and (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    found.append(int(entry.name))
            except (OSError, IndexError):
                continue
    return found


@pytest.fixture
def problem(tmp_path) -> Path:
    return write_problem(tmp_path / "p", timeout=5.0)


@pytest.fixture
def bystanders() -> Iterator[Callable[[int], subprocess.Popen]]:
    """`sleep`s of the test's own, each run as a uid given with os.setuid in the child: none is an engine's."""
    started: dict[int, subprocess.Popen] = {}

    def start(uid: int) -> subprocess.Popen:
        def become() -> None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)

        started[uid] = subprocess.Popen(["sleep", "600"], preexec_fn=become)
        deadline = time.monotonic() + 10
        while started[uid].pid not in _running_as(uid) and time.monotonic() < deadline:
            time.sleep(0.01)
        return started[uid]

    yield start
    for proc in started.values():
        proc.kill()
        proc.wait()


def _alive(proc: subprocess.Popen) -> bool:
    return proc.poll() is None


@root_only
def test_a_slot_uid_that_runs_a_process_the_engine_did_not_start_is_never_taken(problem, bystanders):
    """Processes run as the first slot uids before the engine starts: it takes none of them, runs its jobs as
    another, and every one of them is alive after its jobs."""
    sleeps = [bystanders(BASE_UID + slot) for slot in range(4)]
    engine = Engine(problem, [WHO, *(code for code, _ in KNOWN)])
    try:
        assert not set(engine.uids) & {BASE_UID + slot for slot in range(4)}, engine.uids
        engine.go()
        found = engine.results()
    finally:
        engine.kill()
    assert _reported(found["outcomes"][0]) == engine.uids[0]
    _exact(found["outcomes"][1:])
    assert all(_alive(s) for s in sleeps), [s.returncode for s in sleeps]


@root_only
def test_a_process_started_as_the_engines_slot_uid_is_left_alone_and_the_slot_given_up(problem, bystanders):
    """A process started as the uid the engine holds, between its jobs: the sweeps after them leave it alive, and
    the next job runs as another uid (the candidate could otherwise signal or trace it)."""
    engine = Engine(problem, [WHO, *(code for code, _ in KNOWN), WHO])
    try:
        (held,) = engine.uids
        sleep = bystanders(held)
        engine.go()
        found = engine.results()
    finally:
        engine.kill()
    assert _alive(sleep)
    ran_as = {_reported(found["outcomes"][0]), _reported(found["outcomes"][-1])}
    assert held not in ran_as and ran_as == set(found["uids"]), (held, ran_as, found["uids"])
    _exact(found["outcomes"][1:-1])


ORPHAN_THEN_WAIT = """import os, time
def solve(x):
    if x == 2:
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv("/bin/sleep", ["sleep", MARKER])
            os._exit(0)
        time.sleep(2.5)
    return x * x
"""


@root_only
def test_the_sweep_after_a_job_kills_the_jobs_orphan_and_not_a_process_started_as_its_uid_meanwhile(
    problem, bystanders
):
    """While the job runs (it leaves an orphan in a session of its own, then waits), a process is started as its
    uid from outside the engine: the job's end kills the orphan, and the outsider lives."""
    marker = f"600{uuid.uuid4().int % 10**6:06d}"
    code = ORPHAN_THEN_WAIT.replace("MARKER", repr(marker))
    engine = Engine(problem, [code, *(c for c, _ in KNOWN)])
    try:
        (held,) = engine.uids
        engine.go()
        deadline = time.monotonic() + 20
        while not _running_as(held) and time.monotonic() < deadline:  # the job has started
            time.sleep(0.02)
        assert _running_as(held), "the job never ran"
        sleep = bystanders(held)
        found = engine.results()
    finally:
        engine.kill()
    assert found["outcomes"][0]["scores"] == {"c0": 1.0, "c1": 1.0}, found["outcomes"][0]["error"]
    _exact(found["outcomes"][1:])
    orphans = [p for p in Path("/proc").iterdir() if p.name.isdigit() and marker.encode() in _cmdline(p)]
    assert orphans == []
    assert _alive(sleep)


def _cmdline(path: Path) -> bytes:
    try:
        return (path / "cmdline").read_bytes()
    except OSError:
        return b""


def test_two_engines_with_different_tmpdirs_hold_different_slots_and_score_exactly(problem, tmp_path):
    """Two engines at once, each with a TMPDIR of its own: their slot uids differ (as root; without root both
    keep their own uid), and every job of both scores its program's exact vector."""
    programs = [code for code, _ in SLOW_KNOWN] * 2
    engines = []
    try:
        for name in ("a", "b"):
            tmp = tmp_path / f"tmp-{name}"
            tmp.mkdir()
            engines.append(Engine(problem, programs, env={"TMPDIR": str(tmp)}))
        if os.geteuid() == 0:
            assert not set(engines[0].uids) & set(engines[1].uids), [e.uids for e in engines]
        for engine in engines:
            engine.go()
        found = [engine.results() for engine in engines]
    finally:
        for engine in engines:
            engine.kill()
    for result in found:
        _exact(result["outcomes"], SLOW_KNOWN * 2)


@root_only
def test_a_folder_a_user_made_at_the_old_lock_place_does_not_stop_a_root_engine(problem, tmp_path):
    """Slot locks once followed TMPDIR: a user who made `$TMPDIR/vpo-evolve-slots` first (TMPDIR being
    world-writable, like /tmp) kept every root engine from starting. They no longer live there."""
    tmp = tmp_path / "shared-tmp"
    tmp.mkdir()
    tmp.chmod(0o1777)
    squat = tmp / "vpo-evolve-slots"
    squat.mkdir()
    os.chown(squat, BASE_UID + 900, BASE_UID + 900)
    engine = Engine(problem, [code for code, _ in KNOWN], env={"TMPDIR": str(tmp)})
    try:
        engine.go()
        found = engine.results()
    finally:
        engine.kill()
    _exact(found["outcomes"])
    assert list(squat.iterdir()) == []


@root_only
def test_the_lock_folder_is_refused_unless_root_alone_can_change_it(tmp_path, monkeypatch):
    """The folder of root's slot locks, and the folder it is in, must be root's and closed to others: where a user
    could make or replace it, they could hold or hand out slot uids. One line says which and how to fix it."""
    import sandboxes.process_slots as slots
    from sandboxes.process import ProcessSandbox

    open_parent = tmp_path / "open"
    open_parent.mkdir()
    open_parent.chmod(0o1777)
    monkeypatch.setattr(slots, "LOCK_DIR", open_parent / "locks")
    with pytest.raises(SandboxRefused, match="is not root's alone; chown root and chmod go-w it"):
        ProcessSandbox(slots=1).close()
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o755)
    (closed / "locks").mkdir(mode=0o755)
    os.chown(closed / "locks", BASE_UID + 901, 0)
    monkeypatch.setattr(slots, "LOCK_DIR", closed / "locks")
    with pytest.raises(SandboxRefused, match=r"must be root's with mode 0700 \(it is uid 61901, mode 0755\); remove"):
        ProcessSandbox(slots=1).close()


def _account_with_a_free_successor() -> int:
    """The uid of a real account whose next uid is no account's, no group's and runs nothing."""
    taken = {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()}
    for uid in sorted(p.pw_uid for p in pwd.getpwall()):
        if 100 <= uid < 65000 and uid + 1 not in taken and not _running_as(uid + 1):
            return uid
    pytest.skip("no account here whose next uid is free")


@root_only
def test_a_uid_of_a_real_account_is_never_a_slot(problem):
    """With the slots' base at a real account's uid, the job runs as the next uid, never as that user."""
    from sandboxes.process import ProcessSandbox

    account = _account_with_a_free_successor()
    box = ProcessSandbox(slots=1, base_uid=account)
    try:
        assert box.slot_uids == (account + 1,)
        assert reported(box.evaluate(_load(problem), WHO)) == account + 1
        assert_known_vectors(box, _load(problem))
    finally:
        box.close()


def _load(folder: Path):
    from evolve.problem import load_problem

    return load_problem(folder)
