"""A resumed run refuses a problem folder whose scoring may have changed since the run started, naming the files.

Issue 57, second red-team round (#10-#13): the fingerprint covered problem.toml and the evaluator only, so a run
resumed after an edit of a helper module the evaluator imports, of data/, of the seed or of a Dockerfile went on
silently and the archive held two scorings; a comment added to problem.toml was refused like a real change, with
no word of what changed; and a run resumed from a moved folder kept its old path, so `evolve resume DB` failed
afterwards. Each test drives real `evolve run` / `evolve resume` processes (the replay policy, the process sandbox)
on a real archive, and checks every stored evaluation against the one scoring the run started with.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import db_rows, evolve_run_cmd

TOML = """name = "p"
description = "solve(x) returns f(x)."
[program]
file = "seed.py"
[fitness]
cases = 4
case_prefix = "x"
bounds = [0.0, 1.0]
[limits]
timeout_s = 10
"""
SEED = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return 0\n# EVOLVE-BLOCK-END\n"
HIDDEN = "def f(x):\n    return 2 * x\n"
PARAMS = '{"scale": 1.0}\n'
# The expected answers come from a helper module and a data file, neither problem.toml nor the evaluator.
EVALUATE = """import json, os, sys
sys.path.insert(0, os.path.dirname(__file__))
import hidden
SCALE = json.load(open(os.path.join(os.path.dirname(__file__), "data", "params.json")))["scale"]
def cases():
    return [{"name": f"x_{i:03d}", "input": i, "expected": SCALE * hidden.f(i)} for i in range(4)]
def score(case, output):
    return 1.0 / (1.0 + abs(float(output) - case["expected"]))
"""
EVOLVE = [sys.executable, "-m", "evolve.cli"]


def make_problem(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    for name, text in {"problem.toml": TOML, "seed.py": SEED, "hidden.py": HIDDEN, "evaluate.py": EVALUATE}.items():
        (root / name).write_text(text)
    (root / "data" / "params.json").write_text(PARAMS)
    return root


def make_replay(path: Path) -> str:
    def variant(k: int, body: str) -> str:
        code = f"# EVOLVE-BLOCK-START\ndef solve(x):\n    return {body}\n# EVOLVE-BLOCK-END\n"
        return f"<variant {k}>\n```python\n{code}```\n</variant {k}>\n"

    answers = [variant(1, f"{a} * x") + variant(2, f"{a} * x + 1") + variant(3, f"x + {a}") for a in range(1, 60)]
    path.write_text(json.dumps(answers))
    return f"replay:{path}"


def evolve(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLVE, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def run(folder: Path | str, db: Path, policy: str, budget: int, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        evolve_run_cmd(folder, db, policy, budget, "--workers", "1"),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def ok(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out.stdout


def refused(out: subprocess.CompletedProcess) -> str:
    """The one line of a refused command (exit 2, nothing on stdout past the loading, no traceback)."""
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    return out.stderr.strip()


def stored(db: Path) -> list[tuple]:
    """Every evaluated program of the archive with its stored vector, and the run's status: what a refusal keeps."""
    programs = db_rows(db, "SELECT p.id, p.code, e.scores FROM programs p JOIN evaluations e ON e.program_id = p.id")
    return [*programs, *db_rows(db, "SELECT id, status, problem_fingerprint FROM runs")]


def assert_one_scoring(db: Path) -> int:
    """Each stored vector is exactly the one the run's own scoring (f(x) = 2x, scale 1) gives its program; the count."""
    rows = db_rows(db, "SELECT p.code, e.scores FROM programs p JOIN evaluations e ON e.program_id = p.id")
    for code, scores in rows:
        space: dict = {}
        exec(code, space)
        want = {f"x_{i:03d}": 1.0 / (1.0 + abs(float(space["solve"](i)) - 2 * i)) for i in range(4)}
        assert json.loads(scores) == want, code
    return len(rows)


def test_a_helper_module_and_a_data_file_changed_are_named_and_the_run_is_not_resumed(tmp_path):
    """#10: the evaluator's helper module and data/params.json edited between sessions. Both `evolve run` and
    `evolve resume` refuse, naming the two files, and leave the archive as it was; put back, the run resumes and
    every evaluation in it was scored one way. The archive lies in the problem folder itself: it (with its -wal,
    -shm and lock files, written as the run goes) is not part of the folder's fingerprint."""
    p, policy = make_problem(tmp_path / "p"), make_replay(tmp_path / "replay.json")
    db = p / "a.db"
    ok(run(p, db, policy, 6))
    before = stored(db)
    (p / "hidden.py").write_text("def f(x):\n    return 3 * x\n")
    (p / "data" / "params.json").write_text('{"scale": 2.0}\n')
    line = (
        f"error: sqlite:///{db}: data/params.json and hidden.py changed since run 1 of p started; use a new --db to "
        "start afresh, or put them back as they were to resume the run"
    )
    assert refused(run(p, db, policy, 12)) == line
    assert refused(evolve("resume", str(db), "--max-evaluations", "12")) == line
    assert stored(db) == before
    (p / "hidden.py").write_text(HIDDEN)
    (p / "data" / "params.json").write_text(PARAMS)
    ok(evolve("resume", str(db), "--max-evaluations", "12"))
    assert assert_one_scoring(db) == 12


def test_each_file_that_decides_a_score_is_compared(tmp_path):
    """#10 and #12: the seed, the evaluator, a Dockerfile added, a data file removed, a FIFO added under data/
    (named, never read: reading it would block), each refused on its own, one line naming it, the archive kept."""
    p, policy = make_problem(tmp_path / "p"), make_replay(tmp_path / "replay.json")
    db = tmp_path / "a.db"
    (p / "data" / "notes.txt").write_text("kept\n")
    ok(run(p, db, policy, 6))
    before = stored(db)
    seed_edited = SEED.replace("return 0", "return 7")
    steps = [
        (p / "seed.py", seed_edited, SEED, "seed.py changed"),
        (p / "evaluate.py", EVALUATE + "# tuned\n", EVALUATE, "evaluate.py changed"),
        (p / "Dockerfile", "FROM python:3.11-slim\n", None, "Dockerfile added"),
        (p / "data" / "notes.txt", None, "kept\n", "data/notes.txt removed"),
        (p / "data" / "pipe", "fifo", None, "data/pipe added"),
    ]
    for path, edit, restore, said in steps:
        if edit == "fifo":
            os.mkfifo(path)
        elif edit is None:
            path.unlink()
        else:
            path.write_text(edit)
        them = "it back as it was"
        want = f"{said} since run 1 of p started; use a new --db to start afresh, or put {them} to resume the run"
        assert refused(evolve("resume", str(db), "--max-evaluations", "9")) == f"error: sqlite:///{db}: {want}"
        if restore is None:
            path.unlink()
        else:
            path.write_text(restore)
    assert stored(db) == before
    ok(evolve("resume", str(db), "--max-evaluations", "9"))
    assert assert_one_scoring(db) == 9


def test_a_comment_in_problem_toml_resumes_and_a_changed_setting_is_named(tmp_path):
    """#11: problem.toml is compared by its parsed content. A comment and a reformatted line cannot change a score,
    so the run resumes; a changed setting is refused, naming problem.toml."""
    p, policy = make_problem(tmp_path / "p"), make_replay(tmp_path / "replay.json")
    db = tmp_path / "a.db"
    ok(run(p, db, policy, 6))
    (p / "problem.toml").write_text(
        "# tried a longer timeout once\n" + TOML.replace("cases = 4", "cases   =   4  # x_000..x_003")
    )
    ok(run(p, db, policy, 9))
    assert assert_one_scoring(db) == 9
    (p / "problem.toml").write_text(TOML.replace("timeout_s = 10", "timeout_s = 5"))
    before = stored(db)
    assert refused(run(p, db, policy, 12)) == (
        f"error: sqlite:///{db}: problem.toml changed since run 1 of p started; use a new --db to start afresh, "
        "or put it back as it was to resume the run"
    )
    assert stored(db) == before


def test_a_run_resumed_from_a_moved_folder_records_its_new_place(tmp_path):
    """#13: the folder moved, its archive inside it (runs/p.db, the default of `evolve run .`). `evolve resume`
    cannot find the old path; `evolve run NEWDIR` resumes, says the folder moved, records the new path, and from
    then on `evolve resume DB` finds it; `evolve inspect` shows the move."""
    old, policy = make_problem(tmp_path / "p"), make_replay(tmp_path / "replay.json")
    ok(run(".", Path("runs/p.db"), policy, 6, cwd=old))
    new = tmp_path / "moved" / "q"
    new.parent.mkdir()
    shutil.move(old, new)
    db = new / "runs" / "p.db"
    gone = refused(evolve("resume", str(db), "--max-evaluations", "9"))
    assert gone.startswith(f"error: run 1: its problem folder {old} is gone"), gone
    said = ok(run(new, db, policy, 9))
    assert f"the problem folder moved from {old} to {new}; the run records its new place" in said
    ok(evolve("resume", str(db), "--max-evaluations", "12"))
    assert assert_one_scoring(db) == 12
    assert db_rows(db, "SELECT problem_dir FROM runs") == [(str(new),)]
    assert f"problem_path '{old}' -> '{new}'" in ok(evolve("inspect", str(db)))


def legacy_hash(folder: Path) -> str:
    """The fingerprint archives stored before per-file hashes: problem.toml's bytes and the evaluator's."""
    return hashlib.sha256((folder / "problem.toml").read_bytes() + (folder / "evaluate.py").read_bytes()).hexdigest()[
        :16
    ]


def make_legacy(db: Path, folder: Path) -> None:
    """Rewrite the run as an archive made before per-file hashes stored it: no file hashes, the old fingerprint."""
    import sqlite3

    old = legacy_hash(folder)
    con = sqlite3.connect(db)
    [(raw,)] = con.execute("SELECT config FROM runs").fetchall()
    config = json.loads(raw)
    config.pop("problem_files", None)
    config["problem_hash"] = old
    con.execute("UPDATE runs SET config = ?, problem_fingerprint = ?", (json.dumps(config), old))
    con.commit()
    con.close()


def test_an_archive_from_before_per_file_hashes_is_compared_the_old_way_and_says_so(tmp_path):
    """An older archive stored one hash of problem.toml and the evaluator. A changed problem.toml is refused as
    before, saying only those two are compared; the same folder resumes, saying so, and its files are hashed from
    then on: the next resume names a changed helper module."""
    p, policy = make_problem(tmp_path / "p"), make_replay(tmp_path / "replay.json")
    db = tmp_path / "a.db"
    ok(run(p, db, policy, 6))
    make_legacy(db, p)
    (p / "problem.toml").write_text(TOML + "# a comment: bytes are what the old check compared\n")
    assert refused(run(p, db, policy, 9)) == (
        f"error: sqlite:///{db}: run 1 of p was made with a different problem.toml or evaluator (it was started before "
        "evolve hashed every file of the folder, so only problem.toml and the evaluator are compared); use a new --db "
        "to start afresh"
    )
    (p / "problem.toml").write_text(TOML)
    said = ok(run(p, db, policy, 9))
    assert (
        "run 1 was started before evolve hashed every file of the problem folder: only problem.toml and the "
        "evaluator were compared on this resume; its files are hashed now, and every later resume compares them all"
    ) in said
    assert assert_one_scoring(db) == 9
    (p / "hidden.py").write_text("def f(x):\n    return 3 * x\n")
    assert refused(evolve("resume", str(db), "--max-evaluations", "12")).endswith(
        "hidden.py changed since run 1 of p started; use a new --db to start afresh, or put it back as it was to "
        "resume the run"
    )
