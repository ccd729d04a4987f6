"""Names, paths and program text that a run stores reach the terminal and the Markdown report only as text
(issue 57, finding 10): rich markup in them is shown, not applied (an unmatched `[/]` ended `run`, `inspect` and
a run's summary in a MarkupError), and escape sequences are shown as visible escapes, not acted on.

The runs are real: `evolve run` on a split-form problem with a replay policy, whose ensemble member the problem
folder names with markup and escape sequences, into an archive in a folder whose name holds them too."""

from __future__ import annotations

import json
import os
import pty
import select
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from typer.testing import CliRunner

from evolve.archive import Archive
from evolve.cli import app
from tests.helpers import store_program, write_problem, write_square_problem
from tests.report_run import replay_answers

# A closing tag that matches nothing, a link, then: clear the screen, retitle the window, ring the bell.
HOSTILE = "[/]m[link=http://x]y\x1b[2J\x1b]0;owned\x07"
SHOWN = "[/]m[link=http://x]y\\x1b[2J\\x1b]0;owned\\x07"  # what the terminal shows of it: the text itself
# A program whose comment clears the screen and prints a verdict, and whose string holds a Markdown fence.
LOUD_CODE = (
    "# \x1b[2J\x1b[H ALL 8 CASES PASSED\n"
    "NOTE = '''\n```\n# Injected heading\n````\n'''\n"
    "def solve(x):\n    return x * x\n"
)


def _toml_string(text: str) -> str:
    """`text` as a TOML basic string (JSON's escapes are TOML's for these characters)."""
    return json.dumps(text)


def hostile_problem(root: Path) -> Path:
    """The square problem with one ensemble member, a replay policy the folder names, called HOSTILE."""
    folder = write_square_problem(root / "square")
    (folder / "replay.json").write_text(json.dumps(replay_answers()))
    toml = folder / "problem.toml"
    toml.write_text(
        toml.read_text() + f'\n[[search.policies]]\nspec = "replay:replay.json"\nname = {_toml_string(HOSTILE)}\n'
    )
    return folder


def run_cmd(folder: Path, db: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "evolve.cli",
        "run",
        str(folder),
        "--db",
        str(db),
        "--sandbox",
        "process",
        "--max-evaluations",
        "6",
        "--no-stop-when-solved",
        "--allow-weak-sandbox",
        *extra,
    ]


def cli_env(**extra: str) -> dict[str, str]:
    root = str(Path(__file__).resolve().parents[1])  # this checkout's package, whichever is installed
    return {**os.environ, "PYTHONPATH": root, **extra}


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A finished `evolve run` (its archive's path, and what it printed without a terminal)."""
    root = tmp_path_factory.mktemp("hostile")
    folder = hostile_problem(root)
    db = root / "runs [/]x\x1b[2J" / "a.db"
    ran = subprocess.run(
        run_cmd(folder, db),
        capture_output=True,
        text=True,
        timeout=300,
        env=cli_env(EVOLVE_PROGRESS_EVERY_S="0.2"),
    )
    return db, ran


def test_run_prints_a_hostile_member_name_and_archive_path_as_text(hostile_run) -> None:
    db, ran = hostile_run
    said = ran.stdout + ran.stderr
    assert ran.returncode == 0, said[-3000:]
    assert "Traceback" not in said and "\x1b" not in said and "\x07" not in said, said[-3000:]
    lines = ran.stdout.splitlines()
    shown_db = str(db).replace("\x1b", "\\x1b")
    assert lines[0].startswith("starting run 1 of square in sqlite:////") and lines[0].endswith("/a.db"), lines
    assert any(line.startswith(f"structured sampling: auto, but {SHOWN} cannot") for line in lines), lines
    # the run's summary, which names the member asked last: a MarkupError here once came after the run row was made
    assert any(line.startswith("stalled: ") and f"now asking for {SHOWN}: " in line for line in lines), lines
    assert f"see it with: evolve best '{shown_db}'    or    evolve show '{shown_db}' " in ran.stdout
    with sqlite3.connect(db) as con:  # the run row was made and finished, and the member recorded as given
        assert con.execute("SELECT status FROM runs").fetchall() == [("finished",)]
        assert con.execute("SELECT DISTINCT member FROM prompts").fetchall() == [(HOSTILE,)]


def read_pty(fd: int, proc: subprocess.Popen[bytes], timeout_s: float) -> bytes:
    """Everything written to the terminal until the process ends (or `timeout_s` passes)."""
    out, deadline = b"", time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the other end closed
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    return out


def test_the_live_view_in_a_terminal_shows_a_hostile_member_name_as_text(tmp_path: Path) -> None:
    """With a terminal, `evolve run` draws its live view (rich's Live, whose tables hold the member's name): rich
    writes its own style and cursor codes there, but none of the name's sequences."""
    folder = hostile_problem(tmp_path)
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        run_cmd(folder, tmp_path / "a.db"),
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        env=cli_env(COLUMNS="400", LINES="60", TERM="xterm"),
    )
    os.close(follower)
    try:
        out = read_pty(leader, proc, 300).decode("utf-8", "replace")
    finally:
        proc.kill() if proc.poll() is None else None
        proc.wait()
        os.close(leader)
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "\x1b[2J" not in out and "\x1b]0;owned" not in out and "\x07" not in out, out[-3000:]
    assert out.count(SHOWN) >= 3, out[-3000:]  # the opening lines, the live view's member line, the summary


def add_hostile_rows(db: Path) -> int:
    """What an older archive (before names were checked) or another tool may hold: a run, a policy version and
    an incident named with HOSTILE, and a best program that is LOUD_CODE with a component of that name."""
    archive = Archive(db)
    run = archive.runs()[-1]
    pid, _ = store_program(
        archive,
        run.id,
        LOUD_CODE,
        evaluation={"scores": {"c0": 1.0, "c1": 1.0, HOSTILE: 1.0}, "scalar": 2.0, "duration_s": 0.1},
    )
    archive.add_policy_version(run_id=run.id, base_model=HOSTILE, adapter_path=f"/adapters/{HOSTILE}", number=1)
    archive.add_incident(run.id, "generate", "parse", HOSTILE)
    archive.close()
    with sqlite3.connect(db) as con:
        con.execute("UPDATE runs SET problem_name = ?", (HOSTILE,))
    return pid


@pytest.fixture
def hostile_archive(hostile_run, tmp_path: Path) -> tuple[Path, int]:
    db, ran = hostile_run
    assert ran.returncode == 0, ran.stderr[-3000:]
    copy = tmp_path / "a.db"
    with sqlite3.connect(db) as source, sqlite3.connect(copy) as target:
        source.backup(target)
    return copy, add_hostile_rows(copy)


def test_inspect_prints_stored_hostile_names_as_text(hostile_archive) -> None:
    db, pid = hostile_archive
    shown = CliRunner().invoke(app, ["inspect", str(db)])
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.output and "\x07" not in shown.output
    lines = [line.strip() for line in shown.output.splitlines()]
    assert any(line.startswith(f"run 1 {SHOWN} (finished, ") for line in lines), lines
    assert any(line.startswith(f"member {SHOWN}: ") for line in lines), lines
    assert f"last incident: generate: parse: {SHOWN}" in lines
    assert f"policy v1 (#2): {SHOWN} adapter=/adapters/{SHOWN}" in lines
    assert [SHOWN, "1", str(pid)] in [[cell.strip() for cell in line.split("│")] for line in lines]  # its table row


def markdown_blocks(text: str) -> list[tuple[str, str]]:
    """(type, content) of each block a CommonMark reader makes of `text`: headings, fences, table cells."""
    return [(t.type, t.content) for t in MarkdownIt("commonmark").enable("table").parse(text) if t.type != "text"]


def test_report_keeps_program_text_inside_its_fence_and_escapes_what_a_terminal_acts_on(hostile_archive) -> None:
    db, pid = hostile_archive
    shown = CliRunner().invoke(app, ["report", str(db)])
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.output and "\x07" not in shown.output
    blocks = markdown_blocks(shown.output)
    fences = [content for kind, content in blocks if kind == "fence"]
    code_shown = LOUD_CODE.replace("\x1b", "\\x1b").rstrip() + "\n"
    assert fences == [code_shown]  # the whole program in one block: its ``` and ```` lines did not close it
    assert "# \\x1b[2J\\x1b[H ALL 8 CASES PASSED" in code_shown
    headings = [content for kind, content in blocks if kind == "inline"][:1]
    assert headings == [f"{_md(SHOWN)}: run 1 (finished)"]
    assert f"## Best program: {pid} (scalar 2)" in shown.output
    assert f"- member {_md(SHOWN)}: " in shown.output
    html = MarkdownIt("commonmark").enable("table").render(shown.output)
    assert "<a " not in html and 'href="http://x"' not in html


def _md(text: str) -> str:
    """`text` as the Markdown report writes it inside a line: its Markdown signs backslash-escaped."""
    return "".join("\\" + c if c in "\\`*_[]<>|#" else c for c in text)


def test_check_prints_a_hostile_case_error_as_text(tmp_path: Path) -> None:
    """A seed failing one case with an error full of markup and escapes: `check` warns in one plain line."""
    seed = (
        "# EVOLVE-BLOCK-START\ndef solve(x):\n    if x == 3:\n"
        f"        raise RuntimeError({HOSTILE!r})\n    return x * x\n# EVOLVE-BLOCK-END\n"
    )
    folder = write_problem(tmp_path / "p", seed=seed)
    shown = CliRunner().invoke(app, ["check", str(folder), "--sandbox", "process", "--allow-weak-sandbox"])
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.output and "\x07" not in shown.output
    warning = [line for line in shown.output.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1, shown.output
    assert f"first: c1: RuntimeError: {SHOWN}; `evolve eval " in warning[0], warning
