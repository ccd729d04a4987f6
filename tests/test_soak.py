"""Soak: a run killed with SIGKILL at random moments, resumed each time with the bare command, ends `finished`
with every new child evaluated exactly once, no traceback ever printed, and its options untouched.

Executions are counted by the evaluator itself, not by archive rows (which a unique index would quietly
deduplicate): its trusted `score()` runs once per sandbox execution and appends what the candidate returned,
a tag unique to each program, to a file. An execution scored while the engine was being killed, before its
result was committed, is lost work, not a re-evaluation: it is recognised at the kill (its program had no
evaluation yet) and reported apart.

It is also the suite's SIGKILL test on SQLite (tests/test_loop.py kills a run of the tiny model on PostgreSQL):
after each kill the run is still `running`; the final bare command says it resumes run 1 and reaches the budget;
the seed is added once, no program twice, every child pending at the last kill is evaluated (or found a
duplicate) on resume, and each child's generation is its parent's plus one.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from evolve.problem.samples import write_problem
from tests.helpers import db_rows

pytestmark = pytest.mark.slow

KILLS = 6
# The six sessions had committed 15 evaluations by the last kill (load 4, 2 cores), but 78 and then all 80 of an
# 80 budget on the same machine when quiet; every evaluation after the last kill is the final session's plain run.
BUDGET = 150  # the 200 replayed texts hold about 200 distinct programs

SEED = """
# EVOLVE-BLOCK-START
def solve(x):
    return x
# EVOLVE-BLOCK-END
"""

EVALUATOR = """
LOG = {log!r}


def cases():
    return [{{"name": "tag", "input": 2}}]


def score(case, output):
    with open(LOG, "a") as log:
        log.write(repr(output) + "\\n")
    return (float(output) if isinstance(output, (int, float)) else 0.0), None
"""

TOML = """
name = "soak"
description = "Return a large number."
[program]
entry_point = "solve"
[fitness]
components = [{ name = "tag", fail_value = -1.0 }]  # worse than any tag or 0
[limits]
timeout_s = 10
[search]
islands = 2
group_size = 4
variants = 3
edit_format = "full"
"""


def garbage(rng: random.Random) -> str:
    """What a small model writes on a bad day."""
    pieces = [
        bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))).decode("latin-1"),
        "```python\ndef solve(x):\n    return 7\n# EVOLVE-BLOCK-END\n```",  # a stray marker
        "<<<<<<< SEARCH\n    return x\n=======\n    return x +\n>>>>>>> REPLACE",  # a syntax error
        "<<<<<<< SEARCH\nnot there\n=======\nreturn 1\n>>>>>>> REPLACE",
        "```python\ndef solve(x):\n    return None\n",  # unclosed fence; scores 0
        "<variant 9>" * 3,
    ]
    return rng.choice(pieces)


def replay_texts(rng: random.Random, n: int) -> list[str]:
    texts = []
    for k in range(n):
        valid = f"```python\ndef solve(x):\n    return {1000 + k}  # tag of this program\n```"
        slots = [valid, garbage(rng), garbage(rng)]
        rng.shuffle(slots)
        texts.append("".join(f"<variant {i}>\n{body}\n</variant {i}>\n" for i, body in enumerate(slots, 1)))
    return texts


def tag_of(code: str) -> str:
    """What the program returns for the case: its identity in the execution log (test programs are trusted)."""
    namespace: dict = {}
    exec(compile(code, "<program>", "exec"), namespace)
    return repr(namespace["solve"](2))


def snapshot(db: Path, log: Path) -> tuple[Counter[str], set[str]]:
    """(executions per program tag, tags of programs with an evaluation) right now."""
    executed = Counter(log.read_text().split("\n")[:-1]) if log.exists() else Counter()
    if not db.exists():
        return executed, set()
    con = sqlite3.connect(db)
    try:
        codes = con.execute("SELECT code FROM programs JOIN evaluations ON evaluations.program_id = programs.id")
        committed = {tag_of(code) for (code,) in codes}
    except sqlite3.OperationalError:  # killed before the schema was made
        committed = set()
    finally:
        con.close()
    return executed, committed


def runs_recorded(db: Path) -> bool:
    if not db.exists():
        return False
    con = sqlite3.connect(db)
    try:
        return con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] > 0
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


def pending_variants(db: Path) -> set[int]:
    """Variants parsed into a child that has no program yet: queued or being evaluated when the engine died."""
    return {v for (v,) in db_rows(db, "SELECT id FROM variants WHERE status = 'ok' AND program_id IS NULL")}


def stored_options(db: Path) -> dict:
    con = sqlite3.connect(db)
    try:
        return json.loads(con.execute("SELECT config FROM runs").fetchone()[0])["options"]
    finally:
        con.close()


def test_sigkill_at_random_moments_then_bare_resume_evaluates_each_child_once(tmp_path):
    rng = random.Random(int(os.environ.get("SOAK_SEED", "9")))
    log = tmp_path / "executions.log"
    folder = write_problem(tmp_path / "soak", seed=SEED, evaluate=EVALUATOR.format(log=str(log)), toml=TOML)
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps(replay_texts(rng, 200)))
    db = tmp_path / "soak.db"
    first = [*map(str, (sys.executable, "-m", "evolve.cli", "run", folder, "--db", db))]
    first += ["--policy", f"replay:{replay}", "--sandbox", "process", "--max-evaluations", str(BUDGET)]
    first += ["--allow-weak-sandbox"]  # no answers to hide; a machine without bubblewrap runs it too
    # each session's replay starts again at its first text, so a resumed session re-sends answers whose programs
    # are known (duplicates) for a while: that is no stall, and this test is about kills, not stalls
    first += ["--stall-groups", "200"]
    bare = first[:7]
    lost: dict[str, int] = {}
    outputs: list[str] = []
    options = None
    pending_at_kill: set[int] = set()
    kills = 0
    for attempt in range(KILLS):
        cmd = first if attempt == 0 else bare
        out_file = tmp_path / f"session{attempt}.txt"
        with open(out_file, "w") as sink:
            proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
            if attempt == 0:  # the bare command resumes a run that exists: let the first one be recorded
                while not runs_recorded(db) and proc.poll() is None:
                    time.sleep(0.05)
            time.sleep(rng.uniform(0.5, 3.5))
            assert proc.poll() is None, "the run ended before it could be killed: raise BUDGET"
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        kills += 1
        time.sleep(0.3)
        executed, committed = snapshot(db, log)
        for digest, count in executed.items():
            if digest not in committed:
                lost[digest] = count  # every execution so far of a program with no evaluation was lost work
        outputs.append(out_file.read_text())
        if options is None:
            options = stored_options(db)
        assert stored_options(db) == options
        assert db_rows(db, "SELECT status FROM runs") == [("running",)]  # a kill leaves no chance to say otherwise
        pending_at_kill = pending_variants(db)
        [(programs_at_kill,)] = db_rows(db, "SELECT COALESCE(MAX(id), 0) FROM programs")
    final = subprocess.run(bare, capture_output=True, text=True, timeout=240)
    outputs.append(final.stdout + final.stderr)
    assert final.returncode == 0, final.stderr[-3000:]
    assert not [o for o in outputs if "Traceback" in o], "a traceback was printed"
    assert "resuming run 1" in final.stdout and "evaluation budget reached" in final.stdout, final.stdout[-1500:]

    con = sqlite3.connect(db)
    assert con.execute("SELECT status FROM runs").fetchall() == [("finished",)]
    evaluations = con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
    groups = con.execute("SELECT COUNT(*) FROM prompts").fetchone()[0]
    pending = con.execute("SELECT COUNT(*) FROM variants WHERE status = 'ok' AND program_id IS NULL").fetchone()[0]
    statuses = dict(con.execute("SELECT status, COUNT(*) FROM variants GROUP BY status").fetchall())
    con.close()
    assert evaluations == BUDGET, final.stdout[-1500:]
    assert statuses.get("bad_blocks", 0) > 0 and statuses.get("syntax_error", 0) > 0
    assert options is not None and stored_options(db) == options
    assert options["max_evaluations"] == BUDGET and options["policy"] == f"replay:{replay}"

    executed, committed = snapshot(db, log)
    assert len(committed) == evaluations
    reevaluations = sum(count - (digest in committed) - lost.get(digest, 0) for digest, count in executed.items())
    never_run = committed - set(executed)
    print(
        f"soak: {kills} kills, {groups} groups, {evaluations} evaluations, {sum(lost.values())} executions lost "
        f"to kills, {reevaluations} re-evaluations, {pending} children pending at the end"
    )
    assert never_run == set()
    assert reevaluations == 0

    assert db_rows(db, "SELECT COUNT(*) FROM programs WHERE parent_id IS NULL") == [(1,)]  # the seed, once
    assert db_rows(db, "SELECT COUNT(*) - COUNT(DISTINCT code_hash) FROM programs") == [(0,)]
    # the children pending at the last kill were evaluated first on resume (or found to be duplicates): when the
    # budget ran out before all of them, everything the resume evaluated was one of them
    resumed = {v for (v,) in db_rows(db, f"SELECT id FROM variants WHERE program_id > {programs_at_kill}")}
    left = pending_at_kill & pending_variants(db)
    assert not left or resumed <= pending_at_kill, (left, resumed - pending_at_kill)
    misplaced = "SELECT COUNT(*) FROM programs c JOIN programs p ON c.parent_id = p.id"
    assert db_rows(db, misplaced + " WHERE c.generation != p.generation + 1") == [(0,)]  # generations follow parents
