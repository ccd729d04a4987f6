"""What `evolve best --out` and `evolve export` write where: a one-file program as its seed file whatever its
text, a program of several files only at the paths its problem allows; `--top` a count."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess

import pytest

from tests.output_writes.shell_runs import (
    CLASH_CHILD,
    TREE_CALC,
    TREE_MAIN,
    evolve,
    ok,
    refused,
    scores_of,
    stored_code,
)

pytestmark = [
    pytest.mark.slow,  # `evolve` processes
    pytest.mark.skipif(shutil.which("sh") is None, reason="the test problems are shell programs"),
]


def test_a_one_file_program_that_reads_as_a_tree_is_written_as_the_seed_file(one_file, tmp_path):
    """Finding 1: the `.git/config` variant, written by `best --out` into a git repository, leaves the
    repository's own config alone (and `git status` runs no command of the model's); it lands as seed.sh, byte
    for byte, and scores there what the run stored. `export` writes it as one .sh file, no `.git` anywhere."""
    problem, db, marker = one_file
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    config = (repo / ".git" / "config").read_bytes()
    code = stored_code(db, {"c0": 1.0, "c1": 0.0})
    assert code.startswith("=== FILE: .git/config ===\n")
    ok(evolve("best", str(db), "--component", "c0", "--out", str(repo)))
    subprocess.run(["git", "-C", str(repo), "status", "--short"], capture_output=True, check=False)
    assert not marker.exists()  # git ran no command of the model's
    assert (repo / ".git" / "config").read_bytes() == config
    assert sorted(p.name for p in repo.iterdir()) == [".evolve-written.json", ".git", "seed.sh"]
    assert (repo / "seed.sh").read_text() == code
    assert scores_of(problem, repo / "seed.sh") == {"c0": 1.0, "c1": 0.0}

    out = tmp_path / "exported"
    ok(evolve("export", str(db), str(out)))
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    assert not [p for p in written if ".git" in p.split("/")], written
    programs = [p for p in written if p.startswith("best_")]
    assert len(programs) == 3 and all(p.endswith(".sh") for p in programs), written
    assert code in [(out / p).read_text() for p in programs]


def test_a_one_file_program_whose_tree_would_clash_is_written_out_whole(one_file, tmp_path):
    """The red team's `a.sh` and `a.sh/b`: filetree.check_files refuses that tree, so the archive stored the text
    as the one file it is; `best --out` could not write it, since it took any text that starts with a header for
    a tree. Now it is seed.sh, and scores there what the run stored."""
    problem, db, _ = one_file
    code = stored_code(db, {"c0": 0.0, "c1": 1.0})
    assert code == CLASH_CHILD
    out = tmp_path / "best"
    ok(evolve("best", str(db), "--component", "c1", "--out", str(out)))
    assert (out / "seed.sh").read_text() == CLASH_CHILD and not (out / "a.sh").exists()
    assert scores_of(problem, out / "seed.sh") == {"c0": 0.0, "c1": 1.0}


def test_a_program_of_several_files_is_written_only_where_its_layout_allows(several_files, tmp_path):
    """The run's best program lands as main.sh and lib/calc.sh and scores there what the run stored. A copy of the
    archive whose program names a path the problem's `[program] files` do not allow (`.git/config`, or one
    outside main.sh and lib/) is refused with one line naming that path, and nothing of it is written."""
    problem, db = several_files
    out = tmp_path / "best"
    ok(evolve("best", str(db), "--out", str(out)))
    assert (out / "main.sh").read_text() == TREE_MAIN
    assert (out / "lib" / "calc.sh").read_text() == TREE_CALC.format(body="$1 * $1")
    assert scores_of(problem, out) == {"c0": 1.0, "c1": 1.0}
    ok(evolve("export", str(db), str(tmp_path / "exp")))
    assert len(list((tmp_path / "exp").glob("best_*/lib/calc.sh"))) == 2

    for path in (".git/config", "tools/calc.sh", "lib/.hidden/calc.sh"):
        hostile = tmp_path / f"hostile_{path.replace('/', '_')}.db"
        shutil.copy(db, hostile)
        con = sqlite3.connect(hostile)
        con.execute("UPDATE program_files SET path = ? WHERE path = 'lib/calc.sh'", (path,))
        con.commit()
        con.close()
        target = tmp_path / f"out_{path.replace('/', '_')}"
        refused(evolve("best", str(hostile), "--out", str(target)), path)
        refused(evolve("export", str(hostile), str(target / "exp")), path)
        assert not [p for p in target.rglob("*") if p.is_file() and p.name != ".evolve-written.json"], path


def test_export_top_must_be_a_count(several_files, tmp_path):
    """Finding 11: `--top -1` wrote all programs but the last and said -1; it is refused, before anything is
    written. `--top 1` writes one, and says so; a top larger than the run's programs writes them all and says
    how many."""
    _, db = several_files
    refused(evolve("export", str(db), str(tmp_path / "neg"), "--top", "-1"), "--top -1")
    assert not (tmp_path / "neg").exists()
    assert "and 1 programs" in ok(evolve("export", str(db), str(tmp_path / "one"), "--top", "1"))
    assert len(list((tmp_path / "one").glob("best_*"))) == 1
    assert "and 2 programs" in ok(evolve("export", str(db), str(tmp_path / "all"), "--top", "9"))
    assert len(list((tmp_path / "all").glob("best_*"))) == 2
