"""Files `evolve best --out`, `evolve export`, `evolve report --out/--html` and `evolve init --from` write for the
user (issue #57, red-team findings 1, 2 and 11, and their follow-ups).

Every archive here is made by running the engine (`evolve run` with a replayed model) on small shell problems,
whose candidates run whatever text they are given: a model's variant that reads as a tree of files
(`=== FILE: .git/config ===`) is a valid one-file program there, and scores. The commands must write a one-file
program as its problem's seed file whatever its text, a program of several files only at the paths its
problem's `[program] files` allow (never a dot part), never through a symlink, and never over a file they did
not write; each refusal is one line and exit code 2, and the file planted outside keeps its exact bytes.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import evolve_run_cmd, write_problem

pytestmark = [
    pytest.mark.slow,  # about forty `evolve` processes
    pytest.mark.skipif(shutil.which("sh") is None, reason="the test problems are shell programs"),
]

COMPONENTS = '[fitness]\ncomponents = [{ name = "c0", bounds = [0.0, 1.0] }, { name = "c1", bounds = [0.0, 1.0] }]'
LIMITS = "[limits]\ntimeout_s = 5\nmemory_mb = 512\nmax_processes = 32\n"

# One file, no EVOLVE markers: the whole file is the model's to rewrite. Seed: x + 1, which scores (0, 0).
SH_TOML = f"""
name = "sh_one"
description = "print the square of the number on stdin"
[program]
file = "seed.sh"
language = "sh"
[run]
command = ["sh", "seed.sh"]
{COMPONENTS}
{LIMITS}"""
SH_SEED = "read x\necho $((x + 1))\n"

# Two files laid out by `[program] files`: main.sh (fixed) and lib/ (every file under it; lib/calc.sh holds the
# block). Seed: x + 1; the replayed child squares, which scores (1, 1).
TREE_TOML = f"""
name = "sh_tree"
description = "print the square of the number on stdin"
[program]
files = ["main.sh", "lib/"]
language = "sh"
[run]
command = ["sh", "main.sh"]
{COMPONENTS}
{LIMITS}"""
TREE_MAIN = '. ./lib/calc.sh\nread x\ncalc "$x"\n'
TREE_CALC = "# EVOLVE-BLOCK-START\ncalc() {{ echo $(({body})); }}\n# EVOLVE-BLOCK-END\n"
TREE_VARIANT = "<variant 1>\n=== FILE: lib/calc.sh ===\n```sh\ncalc() { echo $(($1 * $1)); }\n```\n</variant 1>\n"


def git_tree_child(marker: Path) -> str:
    """A one-file shell program that reads as a tree holding `.git/config` (a core.fsmonitor command that
    touches `marker`) and `run.sh`. As one file it scores (1, 0): the header and config lines are commands that
    fail, then it reads x and prints 4."""
    return (
        f'=== FILE: .git/config ===\n[core]\n\tfsmonitor = "touch {marker}; false"\n'
        "=== FILE: run.sh ===\nread x\necho 4\n"
    )


# A one-file shell program that reads as a tree with `a.sh` both a file and a folder: it scores (0, 1).
CLASH_CHILD = "=== FILE: a.sh/b ===\n:\n=== FILE: a.sh ===\nread x\necho 9\n"


def full(*bodies: str) -> str:
    """One completion whose variants rewrite the whole program, each in a shell fence."""
    return "".join(f"<variant {i}>\n```sh\n{b}```\n</variant {i}>\n" for i, b in enumerate(bodies, start=1))


def evolve(*args: str) -> subprocess.CompletedProcess[str]:
    """`evolve ARGS` in a process of its own, as a user runs it (its stderr is what the user sees)."""
    cmd = [sys.executable, "-m", "evolve.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.args, result.stdout, result.stderr)
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """The command's one-line refusal (exit code 2, no traceback), which names each of `words`."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stdout, result.stderr)
    assert lines[0].startswith("error: ") and all(w in lines[0] for w in words), (lines[0], words)
    return lines[0]


def make_run(root: Path, name: str, toml: str, seed: str, program_file: str, replay: str, variants: int) -> Path:
    """The problem folder `root/name`, and its archive after one replayed group of `variants` children."""
    folder = write_problem(root / name, seed=seed, toml=toml, program_file=program_file)
    (root / f"{name}.json").write_text(json.dumps([replay]))
    db = root / f"{name}.db"
    cmd = evolve_run_cmd(folder, db, f"replay:{root / name}.json", 1 + variants)
    flags = ["--workers", "1", "--group-size", "1", "--variants", str(variants), "--edit-format", "full"]
    done = subprocess.run([*cmd, *flags], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return db


@pytest.fixture(scope="module")
def one_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(problem folder, archive, fsmonitor marker) of a one-file run whose children read as trees: the `.git`
    one is best on c0, the `a.sh` one on c1."""
    root = tmp_path_factory.mktemp("one_file")
    marker = root / "FSMONITOR_RAN"
    db = make_run(root, "sh_one", SH_TOML, SH_SEED, "seed.sh", full(git_tree_child(marker), CLASH_CHILD), 2)
    return root / "sh_one", db, marker


@pytest.fixture(scope="module")
def several_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(problem folder, archive) of a run of the two-file problem whose best child squares."""
    root = tmp_path_factory.mktemp("several")
    folder = root / "sh_tree"
    write_problem(folder, seed=TREE_MAIN, toml=TREE_TOML, program_file="main.sh")
    (folder / "lib").mkdir()
    (folder / "lib" / "calc.sh").write_text(TREE_CALC.format(body="$1 + 1"))
    (root / "tree.json").write_text(json.dumps([TREE_VARIANT]))
    db = root / "tree.db"
    cmd = evolve_run_cmd(folder, db, f"replay:{root / 'tree.json'}", 2)
    flags = ["--workers", "1", "--group-size", "1", "--variants", "1", "--edit-format", "full"]
    done = subprocess.run([*cmd, *flags], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return folder, db


def scores_of(problem: Path, program: Path) -> dict[str, float]:
    """The score vector `evolve eval` gives the program written at `program` (a file, or a folder of files)."""
    out = ok(evolve("eval", str(problem), str(program), "--sandbox", "process", "--allow-weak-sandbox", "--json"))
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))["scores"]


def stored_code(db: Path, scores: dict[str, float]) -> str:
    """The code of the run's program whose evaluation has exactly `scores`, read back by `evolve best`."""
    component = next(name for name, value in scores.items() if value == 1.0)
    return ok(evolve("best", str(db), "--component", component))


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


def test_no_symlink_is_followed_at_any_level_of_the_output_folder(one_file, several_files, tmp_path):
    """Finding 2: links planted in the output folder (another user's, in a shared temporary folder) to a file
    or folder outside: OUT itself, OUT/seed.sh, OUT/exp/evaluations.csv, OUT/lib. Each command refuses with
    one line naming the link, and what lies outside keeps its exact bytes and holds nothing new."""
    _, db, _ = one_file
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "shadow"
    secret.write_bytes(b"root:x:0:0::/root:/bin/sh\n")
    before = secret.read_bytes()

    linked_out = tmp_path / "linked_out"
    linked_out.symlink_to(outside, target_is_directory=True)
    refused(evolve("best", str(db), "--out", str(linked_out)), str(linked_out), "link")
    refused(evolve("export", str(db), str(linked_out)), str(linked_out), "link")
    assert sorted(p.name for p in outside.iterdir()) == ["shadow"]

    out = tmp_path / "shared"
    out.mkdir()
    (out / "seed.sh").symlink_to(secret)
    refused(evolve("best", str(db), "--out", str(out)), str(out / "seed.sh"), "link")
    (out / "exp").mkdir()
    (out / "exp" / "evaluations.csv").symlink_to(secret)
    refused(evolve("export", str(db), str(out / "exp")), str(out / "exp" / "evaluations.csv"), "link")
    assert secret.read_bytes() == before

    _, tree_db = several_files
    tree_out = tmp_path / "tree_out"
    tree_out.mkdir()
    (tree_out / "lib").symlink_to(outside, target_is_directory=True)
    refused(evolve("best", str(tree_db), "--out", str(tree_out)), str(tree_out / "lib"), "link")
    assert sorted(p.name for p in outside.iterdir()) == ["shadow"] and secret.read_bytes() == before


def test_a_file_the_engine_did_not_write_is_never_overwritten(one_file, tmp_path):
    """`best --out` into a folder holding the user's own seed.sh refuses, naming it; into a fresh folder it
    writes, and writes again over its own file, but not once the user has changed that file. `export` likewise
    for evaluations.csv."""
    _, db, _ = one_file
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "seed.sh").write_text("echo my own work\n")
    refused(evolve("best", str(db), "--out", str(mine)), str(mine / "seed.sh"))
    assert (mine / "seed.sh").read_text() == "echo my own work\n"

    out = tmp_path / "out"
    ok(evolve("best", str(db), "--out", str(out)))
    ok(evolve("best", str(db), "--out", str(out)))  # its own file, unchanged since: replaced
    (out / "seed.sh").write_text("echo edited by the user\n")
    refused(evolve("best", str(db), "--out", str(out)), str(out / "seed.sh"))
    assert (out / "seed.sh").read_text() == "echo edited by the user\n"

    exp = tmp_path / "exp"
    ok(evolve("export", str(db), str(exp)))
    ok(evolve("export", str(db), str(exp)))
    (exp / "evaluations.csv").write_text("my notes\n")
    refused(evolve("export", str(db), str(exp)), str(exp / "evaluations.csv"))
    assert (exp / "evaluations.csv").read_text() == "my notes\n"


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


OTHER_UID = 65534  # nobody: another local user, who owns what they made in a shared folder


def test_report_out_and_html_write_through_no_link_and_over_no_file_of_the_user(one_file, tmp_path):
    """Follow-up of finding 2: `report --out FILE` and `report --html FILE` wrote with `write_text`, which
    followed a link planted at FILE (to a file outside, or a dangling one, which it created) and overwrote any
    file there. Each is refused with one line naming FILE, and what lies outside keeps its exact bytes and gets
    no new file. A fresh FILE is written (the Markdown exactly as stdout prints it), and written again over
    evolve's own file, but not over the user's."""
    _, db, _ = one_file
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "shadow"
    secret.write_bytes(b"root:x:0:0::/root:/bin/sh\n")
    before = secret.read_bytes()
    shared = tmp_path / "shared"
    shared.mkdir()
    markdown = ok(evolve("report", str(db)))
    for flag in ("--out", "--html"):
        linked = shared / f"linked{flag}"
        linked.symlink_to(secret)
        refused(evolve("report", str(db), flag, str(linked)), str(linked), "link")
        dangling = shared / f"dangling{flag}"
        dangling.symlink_to(outside / f"created{flag}")
        refused(evolve("report", str(db), flag, str(dangling)), str(dangling), "link")
        mine = shared / f"mine{flag}"
        mine.write_text("my notes\n")
        refused(evolve("report", str(db), flag, str(mine)), str(mine))
        assert mine.read_text() == "my notes\n"
        fresh = shared / f"fresh{flag}"
        ok(evolve("report", str(db), flag, str(fresh)))
        ok(evolve("report", str(db), flag, str(fresh)))  # its own file, unchanged since: replaced
        written = fresh.read_text()
        assert written == markdown if flag == "--out" else written.startswith("<!doctype html>")
    assert sorted(p.name for p in outside.iterdir()) == ["shadow"] and secret.read_bytes() == before


def test_init_from_writes_problem_toml_through_no_link(tmp_path, monkeypatch):
    """`evolve init --from DIR` checked that DIR held no problem.toml, scored the seed (seconds), then wrote
    problem.toml with `write_text`: a link planted there meanwhile (another local user, in a shared folder) was
    followed, and the file it named made. Now it is refused with one line naming the link, and nothing is made
    outside. Without the link, problem.toml is written, and the folder's problem scores the known programs
    exactly."""
    from typer.testing import CliRunner

    import evolve.cli.problem_cmds as problem_cmds
    from evolve.cli import app

    source = tmp_path / "oe"
    shutil.copytree(Path(__file__).parent / "openevolve_folders" / "plain_dict", source)
    outside = tmp_path / "outside"
    outside.mkdir()
    loaded = problem_cmds.load_or_fail

    def planted_while_scored(folder: Path, sandbox_kind: str = "auto"):
        problem = loaded(folder, sandbox_kind)
        (folder / "problem.toml").symlink_to(outside / "planted.toml")
        return problem

    monkeypatch.setattr(problem_cmds, "load_or_fail", planted_while_scored)
    said = CliRunner().invoke(app, ["init", "--from", str(source), "--sandbox", "process"], catch_exceptions=False)
    lines = [line for line in said.stderr.splitlines() if line.strip()]
    assert said.exit_code == 2 and len(lines) == 1, (said.exit_code, said.stdout, said.stderr)
    assert str(source / "problem.toml") in lines[0] and "link" in lines[0], lines
    assert list(outside.iterdir()) == []

    monkeypatch.setattr(problem_cmds, "load_or_fail", loaded)
    (source / "problem.toml").unlink()
    ok(evolve("init", "--from", str(source), "--sandbox", "process"))
    assert (source / "problem.toml").is_file() and not (source / "problem.toml").is_symlink()
    program = tmp_path / "square.py"
    for code, want in (("x * x", {"exact": 1.0, "close": 1.0}), ("x * x + 2", {"exact": 0.0, "close": 1.0})):
        program.write_text(f"def solve(x):\n    return {code}\n")
        assert scores_of(source, program) == want


@pytest.mark.skipif(os.geteuid() != 0, reason="a folder another user owns is made with chown, as root")
def test_a_folder_another_user_owns_in_a_world_writable_folder_is_not_written_into(one_file, several_files, tmp_path):
    """Follow-up: an OUT folder that another local user made in a folder anyone may write to (/tmp) is theirs to
    fill with links or swap afterwards, so no command writes into it (as git and ssh refuse what another user
    owns): one line naming it, and it stays empty. Likewise a subfolder of OUT they made there, and a record
    of evolve's they planted. Ours (root's here) in the same folder is written, and the program written there
    scores what the run stored; another user's folder in a folder only its owner may write to is written too."""
    problem, db, _ = one_file
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    theirs = shared / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    refused(evolve("best", str(db), "--out", str(theirs)), str(theirs), "another user")
    refused(evolve("export", str(db), str(theirs)), str(theirs), "another user")
    refused(evolve("report", str(db), "--out", str(theirs / "report.md")), str(theirs), "another user")
    here = [sys.executable, "-m", "evolve.cli", "report", str(db), "--out", "report.md"]  # from inside it
    refused(subprocess.run(here, cwd=theirs, capture_output=True, text=True, timeout=300, check=False), "another user")
    assert list(theirs.iterdir()) == []

    _, tree_db = several_files
    open_out = shared / "open"  # ours, but anyone may write in it, as in /tmp itself
    open_out.mkdir()
    open_out.chmod(0o1777)
    (open_out / "lib").mkdir()
    os.chown(open_out / "lib", OTHER_UID, OTHER_UID)
    refused(evolve("best", str(tree_db), "--out", str(open_out)), str(open_out / "lib"), "another user")
    assert list((open_out / "lib").iterdir()) == []
    planted = open_out / ".evolve-written.json"
    planted.write_text(json.dumps({"written_by": "evolve", "files": {}}))
    os.chown(planted, OTHER_UID, OTHER_UID)
    refused(evolve("report", str(db), "--out", str(open_out / "report.md")), str(planted), "another user")
    assert not (open_out / "report.md").exists()

    mine = shared / "mine"
    ok(evolve("best", str(db), "--component", "c0", "--out", str(mine)))
    assert scores_of(problem, mine / "seed.sh") == {"c0": 1.0, "c1": 0.0}
    private = tmp_path / "private"  # root's, 0755: only its owner makes folders there
    private.mkdir()
    other = private / "other"
    other.mkdir()
    os.chown(other, OTHER_UID, OTHER_UID)
    ok(evolve("best", str(db), "--component", "c1", "--out", str(other)))
    assert scores_of(problem, other / "seed.sh") == {"c0": 0.0, "c1": 1.0}
