"""`evolve report --out/--html` and `evolve init --from` write through no link and over no file of the user's."""

from __future__ import annotations

import shutil
from pathlib import Path

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
    shutil.copytree(Path(__file__).parent.parent / "openevolve_folders" / "plain_dict", source)
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
