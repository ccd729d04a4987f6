"""A problem's own layout decides whether a program is one file or several, never the program's text (issue #57,
finding 1's follow-up).

On a problem of one file, a text that starts with a `=== FILE: ` line is still one file, named as the seed: a
shell problem even runs and scores such a text, so a model can write one. Before, the parser, the prompt, the
code hash, the archive's storage and `evolve show` each took it for a program of several files. The sandbox did
not (it laid the text out as seed.sh, with no `.git/` beside it, and the evaluator ran nothing else), so the worst
a model gained was a program whose lineage could no longer change: every honest rewrite of it was refused
(`bad_blocks`: "the program's file headers are broken"), every change to one of its "files" too (`outside_block`:
that file has no EVOLVE blocks), its prompt said the program had several files none of which might change, and a
different program was taken for a copy of it (its `calc.py` part normalised as Python) and never evaluated.

The run here starts from such a seed, so that every group's parent is that program whatever selection does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import db_rows, evolve_run_cmd, write_problem

pytestmark = [
    pytest.mark.slow,  # one `evolve run` and one `evolve show`
    pytest.mark.skipif(shutil.which("sh") is None, reason="the test problem is a shell program"),
]

TOML = """
name = "sh_layout"
description = "print the square of the number on stdin"
[program]
file = "seed.sh"
language = "sh"
[run]
command = ["sh", "seed.sh"]
[fitness]
components = [{ name = "c0", bounds = [0.0, 1.0] }, { name = "c1", bounds = [0.0, 1.0] }]
[limits]
timeout_s = 5
memory_mb = 512
max_processes = 32
"""

# One shell file that reads as three files. As one file its header and config lines are commands that fail; x=1
# is set, and it prints y + 2: 2 -> 4 (c0 right), 3 -> 5 (c1 wrong).
SEED = (
    "=== FILE: .git/config ===\n[core]\n\tfsmonitor = false\n"
    "=== FILE: calc.py ===\nx=1\n"
    "=== FILE: run.sh ===\nread y\necho $((y + x + 1))\n"
)
SEED_SCORES = {"c0": 1.0, "c1": 0.0}

HONEST = "read x\necho $((x * x))\n"  # a whole rewrite that drops the headers: squares
NINE = SEED.replace("echo $((y + x + 1))", "echo 9")  # a change to the "file" run.sh: 3 -> 9 only
SPACED = SEED.replace("x=1", "x = 1")  # `x` is then a command that fails: prints y + 1, right for neither case
CHILDREN = {HONEST: {"c0": 1.0, "c1": 1.0}, NINE: {"c0": 0.0, "c1": 1.0}, SPACED: {"c0": 0.0, "c1": 0.0}}

COMPLETION = (
    f"<variant 1>\n```sh\n{HONEST}```\n</variant 1>\n"
    f"<variant 2>\n```sh\n{NINE}```\n</variant 2>\n"
    "<variant 3>\n<<<<<<< SEARCH\nx=1\n=======\nx = 1\n>>>>>>> REPLACE\n</variant 3>\n"
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The archive of a run of the one-file problem whose seed reads as a tree: one group of three variants."""
    root = tmp_path_factory.mktemp("layout")
    folder = write_problem(root / "sh_layout", seed=SEED, toml=TOML, program_file="seed.sh")
    (root / "replay.json").write_text(json.dumps([COMPLETION]))
    db = root / "run.db"
    cmd = evolve_run_cmd(folder, db, f"replay:{root / 'replay.json'}", 1 + len(CHILDREN))
    flags = ["--workers", "1", "--group-size", "1", "--variants", "3", "--edit-format", "full", "--stall-groups", "3"]
    done = subprocess.run([*cmd, *flags], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return db


def test_a_one_file_program_that_reads_as_a_tree_is_one_file_to_every_part_of_the_engine(run: Path) -> None:
    """The first group's three variants all parse (before: `bad_blocks`, `outside_block`, `duplicate`), and each
    child, stored as the one text it is, scores its own exact vector, as the seed does: the sandbox ran each as
    seed.sh alone. The prompt showed the seed as the one editable text it is, the archive keeps every program in
    its `code` column (no file rows), and `evolve show` diffs a child against its parent as one text."""
    # Groups are stored from threads: a second group (the replay answers it alike, so its variants are copies of
    # the first's) may commit first, so the first group's variants are the ones that are not duplicates.
    statuses = db_rows(run, "SELECT v.slot, v.status, v.detail FROM variants v ORDER BY v.id")
    first = sorted((slot, status) for slot, status, _ in statuses if status != "duplicate")
    assert first == [(0, "ok"), (1, "ok"), (2, "ok")], statuses
    assert len(statuses) % 3 == 0, statuses  # every other group: three copies of the first group's children

    rows = db_rows(
        run,
        "SELECT p.id, p.code, p.tree_length, e.scores, e.error_kind FROM programs p "
        "JOIN evaluations e ON e.program_id = p.id ORDER BY p.id",
    )
    stored = {code: (json.loads(scores), error) for _, code, _, scores, error in rows}
    assert stored == {SEED: (SEED_SCORES, None), **{code: (want, None) for code, want in CHILDREN.items()}}
    assert [length for _, _, length, _, _ in rows] == [None] * 4
    assert db_rows(run, "SELECT COUNT(*) FROM program_files") == [(0,)]

    seed_id = next(pid for pid, code, *_ in rows if code == SEED)
    [(prompt,)] = db_rows(run, f"SELECT text FROM prompts WHERE parent_id = {seed_id} ORDER BY id LIMIT 1")
    assert "several files" not in prompt and "=== FILE: run.sh ===\n```" not in prompt
    assert f"Editable code:\n\n```sh\n{SEED.rstrip()}\n```" in prompt

    nine_id = next(pid for pid, code, *_ in rows if code == NINE)
    shown = subprocess.run(
        [sys.executable, "-m", "evolve.cli", "show", str(run), str(nine_id)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"--- program {seed_id}\n+++ program {nine_id}\n" in shown.stdout
    assert f"program {seed_id}/run.sh" not in shown.stdout
