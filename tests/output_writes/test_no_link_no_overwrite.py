"""No output command writes through a symlink at any level, over a file it did not write, or into a folder another
user owns in a world-writable folder."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.output_writes.shell_runs import (
    evolve,
    ok,
    refused,
    scores_of,
)

pytestmark = [
    pytest.mark.slow,  # `evolve` processes
    pytest.mark.skipif(shutil.which("sh") is None, reason="the test problems are shell programs"),
]


OTHER_UID = 65534  # nobody: another local user, who owns what they made in a shared folder


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
    refused(evolve("report", str(db), "--out", "report.md", cwd=theirs), "another user")  # from inside it
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
