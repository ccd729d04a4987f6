"""Programs of several files in the archive, the prompt and the CLI: one new blob for a child that changes one
file of fifty, archives from before program files open and resume, the prompt's views of the files, and
`evolve check/run/best/show/export` and `evolve init --files` with a tree. (Loading, parsing and scoring the
shipped example, and hostile edits: tests/test_multi_file.py.)"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.archive import Archive
from evolve.cli import app
from evolve.filetree import join_files, split_files
from evolve.problem import Problem, ProblemError, load_problem
from evolve.prompts import PromptInputs, build_prompt
from evolve.prompts.tree_view import current_program
from sandboxes.process import ProcessSandbox
from tests.helpers import store_program
from tests.test_multi_file import EXAMPLE, TWO_FILES


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(EXAMPLE)


@pytest.fixture(scope="module")
def process_box():
    box = ProcessSandbox(slots=1)
    yield box
    box.close()


def test_a_child_that_changes_one_file_of_fifty_stores_one_new_blob(tmp_path):
    files = [(f"part_{i:02d}.py", f"VALUE_{i} = {i}\n") for i in range(50)]
    seed = join_files(files)
    child = join_files([(p, t.replace("= 7", "= 70")) for p, t in files])
    archive = Archive(tmp_path / "a.db")
    try:
        run = archive.create_run("fifty", str(tmp_path), "fp", {}, 0)
        scored = {"scores": {"c0": 1.0}, "scalar": 1.0, "duration_s": 0.1}
        seed_id, _ = store_program(archive, run.id, seed, evaluation=scored, multi_file=True)
        child_id, _ = store_program(archive, run.id, child, evaluation=scored, parent_id=seed_id, multi_file=True)
        assert archive.codes([seed_id, child_id]) == {seed_id: seed, child_id: child}
        assert archive.program(child_id).code == child
        assert archive.scored_programs(run.id)[1].code_length == len(child)
        plain = "def solve(x):\n    return x\n"
        plain_id, _ = store_program(archive, run.id, plain, evaluation=scored)
        assert archive.codes([plain_id]) == {plain_id: plain}
    finally:
        archive.close()
    db = sqlite3.connect(tmp_path / "a.db")
    try:
        count = lambda table: db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]  # noqa: E731
        assert (count("program_blobs"), count("program_files")) == (51, 100)
        assert db.execute("SELECT code FROM programs WHERE id = ?", (child_id,)).fetchone() == ("",)
    finally:
        db.close()


def test_an_archive_from_before_program_files_opens_and_its_run_resumes(tmp_path):
    """A one-file archive at the schema before this change: it opens (migrated), reads its programs back as they
    were, and its run resumes and scores a new child."""
    from evolve.loop import SearchLoop, run_search
    from evolve.runs import open_run
    from policies.replay import ReplayPolicy
    from tests.helpers import SQUARE_SEED, downgrade_archive
    from tests.test_loop_parts import answer, block, wired

    loop = wired(tmp_path, ["-"], group_size=1, variants=1, max_evaluations=2)
    seed_id, _ = store_program(
        loop.archive,
        loop.run.id,
        SQUARE_SEED,
        evaluation={"scores": {"c0": 0.0, "c1": 0.0}, "scalar": 0.0, "duration_s": 0.1},
    )
    loop.archive.close()
    downgrade_archive(tmp_path / "a.db", "0005_issue24")
    db = sqlite3.connect(tmp_path / "a.db")
    assert "tree_length" not in {row[1] for row in db.execute("PRAGMA table_info(programs)")}
    assert "build_s" not in {row[1] for row in db.execute("PRAGMA table_info(evaluations)")}  # nor 0007's column
    db.close()

    archive = Archive(tmp_path / "a.db")
    try:
        assert archive.codes([seed_id]) == {seed_id: SQUARE_SEED}
        opened = open_run(archive, loop.problem, loop.options)
        run, resumed = opened.run, opened.resumed
        assert resumed
        square = "def solve(x):\n    return x * x\n"
        again = SearchLoop(loop.problem, archive, ReplayPolicy([answer(square)]), loop.sandbox, run, loop.options)
        run_search(again)
        rows = {p.id: p for p, _ in archive.evaluation_rows(run)}
        assert len(rows) == 2 and [p.code for p in rows.values()] == [SQUARE_SEED, block(square)]
        assert [e.scores for _, e in archive.evaluation_rows(run)][1] == {"c0": 1.0, "c1": 1.0}
        assert [e.build_s for _, e in archive.evaluation_rows(run)] == [None, None]  # Python builds nothing
    finally:
        loop.sandbox.close()
        archive.close()


def test_the_prompt_shows_block_files_whole_and_trims_files_without_blocks_first(problem):
    inputs = PromptInputs("desc", problem.seed_code, {"case_000": 0.5}, None, [], 2, "diff", multi_file=True)
    prompt = build_prompt(inputs)
    assert "=== FILE: lib/ranking.py ===\n```" in prompt and "=== FILE: solver.py ===" in prompt
    assert "write that file's header line exactly as shown" in prompt
    files = dict(split_files(problem.seed_code))
    editable = len(files["lib/params.py"]) + len(files["lib/ranking.py"])
    tight = current_program(problem.seed_code, "python", budget=editable + 100)
    assert "def fill_fraction" in tight and "def order" in tight and "def solve" not in tight
    assert "not shown): solver.py" in tight


def test_prompt_view_blocks_shows_only_the_blocks_under_their_headers_and_names_the_fixed_files(tmp_path):
    """`[program] prompt_view = "blocks"` (the example sets it): a small model given the fixed solver.py rewrote it
    instead of the blocks; this view shows the blocks as a one-file program's are shown, under their headers."""
    folder = tmp_path / "k"
    shutil.copytree(EXAMPLE, folder)
    toml = folder / "problem.toml"
    assert 'prompt_view = "blocks"' in toml.read_text()

    def prompt_of(folder: Path) -> str:
        problem = load_problem(folder)
        view, code = problem.config.program.prompt_view, problem.seed_code
        return build_prompt(
            PromptInputs("desc", code, {}, None, [], 2, "full", language="python", program_view=view, multi_file=True)
        )

    blocks = prompt_of(folder).split("# Current program")[1]
    assert "def solve" not in blocks and "not shown): solver.py (18 lines)" in blocks
    assert "=== FILE: lib/params.py ===\n```python\ndef fill_fraction():" in blocks
    assert "=== FILE: lib/ranking.py ===\n```python\ndef order(items):" in blocks
    toml.write_text(toml.read_text().replace('prompt_view = "blocks"', 'prompt_view = "files"'))
    files = prompt_of(folder).split("# Current program")[1]
    assert "def solve" in files and '=== FILE: lib/params.py ===\n```python\n"""Settings of the packer."""' in files
    toml.write_text(toml.read_text().replace('prompt_view = "files"', 'prompt_view = "block"'))
    with pytest.raises(ProblemError, match="prompt_view"):
        load_problem(folder)


@pytest.mark.slow
def test_evolve_check_run_best_show_and_export_handle_the_tree(tmp_path):
    """The example checks; a short replayed run finds the two-file improvement; `best --out` and `export` write
    it as a tree and `show` diffs it per file."""
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([TWO_FILES]))
    db = str(tmp_path / "k.db")
    runner = CliRunner()

    def invoke(*args: str) -> str:
        result = runner.invoke(app, list(args), catch_exceptions=False)
        assert result.exit_code == 0, (args, result.output)
        return result.output

    assert "seed score vector" in invoke("check", str(EXAMPLE), "--sandbox", "process")
    invoke(
        "run", str(EXAMPLE), "--db", db, "--policy", f"replay:{replay}", "--sandbox", "process", "--workers", "1",
        "--group-size", "1", "--variants", "2", "--max-evaluations", "3",
    )  # fmt: skip
    archive = Archive(db)
    best = archive.program(archive.best_program(archive.find_run()).id)
    archive.close()
    assert best is not None and best.parent_id == 1
    invoke("best", db, "--out", str(tmp_path / "best"))
    assert "/ items[i][1]" in (tmp_path / "best" / "lib" / "ranking.py").read_text()
    assert "return 1.0" in (tmp_path / "best" / "lib" / "params.py").read_text()
    assert (tmp_path / "best" / "solver.py").read_text() == (EXAMPLE / "solver.py").read_text()
    shown = invoke("show", db, str(best.id))
    assert f"+++ program {best.id}/lib/params.py" in shown and "--- program 1/lib/ranking.py" in shown
    assert "solver.py" not in shown.split("--- program 1", 1)[1]  # unchanged files have no diff
    invoke("export", db, str(tmp_path / "out"))
    exported = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.py"))
    assert (
        f"best_01_program_{best.id}/lib/ranking.py" in exported and f"best_01_program_{best.id}/solver.py" in exported
    )
    scored = invoke("eval", str(EXAMPLE), str(tmp_path / "best"), "--sandbox", "process", "--json")
    reply = next(line for line in scored.splitlines() if line.startswith("{"))
    assert json.loads(reply)["scores"] == best.evaluation.scores


def test_init_files_writes_a_two_file_python_problem_that_scores_as_the_one_file_template(tmp_path, process_box):
    from evolve.problem.scaffold import scaffold

    scaffold(tmp_path / "one")
    scaffold(tmp_path / "two", several_files=True)
    one, two = load_problem(tmp_path / "one"), load_problem(tmp_path / "two")
    assert two.files == ("seed.py", "helpers.py") and not one.files
    scored = [process_box.evaluate(p, p.seed_code) for p in (one, two)]
    assert [s.error for s in scored] == [None, None] and scored[0].scores == scored[1].scores
    with pytest.raises(ValueError, match="only with --language python"):
        scaffold(tmp_path / "c", "c", several_files=True)
