"""Programs of several files (issue 25): the shipped three-file example scores its exact vectors in both
sandboxes, a variant that edits two files applies and scores higher, a hostile edit or program naming a path
outside the program is refused with known programs still scoring exactly afterwards, the archive stores one
new blob for a child that changes one file of fifty, old archives open, and the CLI writes the tree."""

from __future__ import annotations

import json
import shutil
import sqlite3
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.archive import Archive
from evolve.cli import app
from evolve.filetree import join_files, split_files
from evolve.problem import Problem, ProblemError, load_problem
from evolve.problem.outcome import ErrorKind
from evolve.prompts import PromptInputs, build_prompt, parse_completion
from evolve.prompts.tree_view import current_program
from sandboxes.process import ProcessSandbox
from tests.helpers import docker_sandbox_or_skip, store_program

EXAMPLE = Path(__file__).resolve().parents[1] / "problems" / "knapsack_files"


def in_order(items, i):
    return i


def by_ratio(items, i):
    return -items[i][0] / items[i][1]


def reference(problem: Problem, key, fill: float) -> dict[str, float]:
    """The vector the example's program scores with this ranking and fill fraction, worked out here."""
    out = {}
    for case in problem.cases:
        items, room = case.input["items"], case.input["capacity"] * fill
        chosen, used = [], 0
        for i in sorted(range(len(items)), key=lambda i: key(items, i)):
            if used + items[i][1] <= room:
                chosen.append(i)
                used += items[i][1]
        out[case.name] = problem.score_case(case, sorted(chosen))[0]
    return out


TWO_FILES = """<variant 1>
=== FILE: lib/ranking.py ===
<<<<<<< SEARCH
    return list(range(len(items)))
=======
    return sorted(range(len(items)), key=lambda i: -items[i][0] / items[i][1])
>>>>>>> REPLACE
=== FILE: lib/params.py ===
<<<<<<< SEARCH
    return 0.6
=======
    return 1.0
>>>>>>> REPLACE
</variant 1>
<variant 2>
=== FILE: lib/params.py ===
```python
def fill_fraction():
    return 1.0
```
</variant 2>
"""

# Each names a file it may not touch; the status the parser must give it.
HOSTILE_VARIANTS = {
    "a path that climbs out": ("=== FILE: ../x.py ===\n```python\nx = 1\n```\n", "parse_error"),
    "an absolute path": (
        "=== FILE: /etc/passwd ===\n<<<<<<< SEARCH\nroot\n=======\nowned\n>>>>>>> REPLACE\n",
        "parse_error",
    ),
    "a file not in the program": ("=== FILE: lib/new.py ===\n```python\nx = 1\n```\n", "parse_error"),
    "the file without blocks": (
        "=== FILE: solver.py ===\n```python\ndef solve(i):\n    return []\n```\n",
        "outside_block",
    ),
    "a header inside a block": (
        "```python\ndef order(items):\n    return []\n=== FILE: ../a b.py ===\nimport os\n```\n"
        "```python\ndef fill_fraction():\n    return 1.0\n```\n",
        "bad_blocks",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def problem() -> Problem:
    return load_problem(EXAMPLE)


@pytest.fixture(scope="module")
def children(problem) -> list[str]:
    """The two-file child and the one-file child that TWO_FILES makes from the seed."""
    parsed = parse_completion(problem.seed_code, TWO_FILES, 2)
    assert [v.status for v in parsed] == ["ok", "ok"], [v.detail for v in parsed]
    return [v.code for v in parsed]  # type: ignore[misc]


@pytest.fixture(scope="module")
def process_box():
    box = ProcessSandbox(slots=1)
    yield box
    box.close()


def known(problem: Problem, children: list[str]) -> list[tuple[str, dict[str, float]]]:
    return [
        (problem.seed_code, reference(problem, in_order, 0.6)),
        (children[0], reference(problem, by_ratio, 1.0)),
        (children[1], reference(problem, in_order, 1.0)),
    ]


def assert_known_vectors(box, problem: Problem, children: list[str]) -> None:
    got = [box.evaluate(problem, code).scores for code, _ in known(problem, children)]
    assert got == [want for _, want in known(problem, children)]


def test_the_example_loads_as_three_files_and_an_edit_spanning_two_of_them_applies(problem, children):
    assert problem.files == ("solver.py", "lib/params.py", "lib/ranking.py")
    assert problem.config.program.entry == "solver.py"
    before, after = dict(split_files(problem.seed_code)), dict(split_files(children[0]))
    assert [p for p in before if before[p] != after[p]] == ["lib/params.py", "lib/ranking.py"]
    assert "return 1.0" in after["lib/params.py"] and "/ items[i][1]" in after["lib/ranking.py"]
    one = dict(split_files(children[1]))
    assert [p for p in before if before[p] != one[p]] == ["lib/params.py"]
    # The embedded model copies every file it is shown: an unchanged copy of the fixed file is no edit of it.
    echo = f"=== FILE: solver.py ===\n```python\n{before['solver.py']}```\n" + TWO_FILES.split("<variant 2>\n")[1]
    [echoed] = parse_completion(problem.seed_code, echo.replace("</variant 2>", ""), 1)
    assert (echoed.status, echoed.code) == ("ok", children[1])


def test_a_file_named_by_its_path_alone_is_read_as_its_header(problem, children):
    """The embedded model names a file by its bare path, on a line of its own or as the first line of its fence
    (where Python read it as `lib / params.py`: three NameError crashes in one 240 s run)."""
    fill = "def fill_fraction():\n    return 1.0\n"
    bodies = [
        f"```python\nlib/params.py\n{fill}```\n",
        f"```python\n# lib/params.py\n{fill}```\n",
        f"**lib/params.py**:\n```python\n{fill}```\n",
        f"lib/params.py\n\n```python\n{fill}```\n",
    ]
    text = "".join(f"<variant {k}>\n{body}</variant {k}>\n" for k, body in enumerate(bodies, 1))
    parsed = parse_completion(problem.seed_code, text, len(bodies))
    assert [(v.status, v.code) for v in parsed] == [("ok", children[1])] * len(bodies), [v.detail for v in parsed]
    inside = "```python\ndef fill_fraction():\n    # as lib/params.py says\n    # lib/ranking.py\n    return 1.0\n```\n"
    [kept] = parse_completion(problem.seed_code, f"<variant 1>\n{inside}</variant 1>", 1)
    assert kept.status == "ok", kept.detail  # a path further inside a fence is a comment of the code
    assert "# as lib/params.py says\n    # lib/ranking.py\n" in dict(split_files(kept.code))["lib/params.py"]


def test_a_block_under_another_files_header_goes_to_the_file_whose_block_it_defines(problem):
    """Seen with the embedded model: `def order` under lib/params.py's header replaced fill_fraction, and every
    case crashed. Code that defines names of one other file's block only is that file's; code that names no
    block, or a block of its own file, stays where its header puts it."""
    ratio = "def order(items):\n    return sorted(range(len(items)), key=lambda i: -items[i][0] / items[i][1])\n"
    misplaced = [f"=== FILE: {where} ===\n```python\n{ratio}```\n" for where in ("lib/params.py", "solver.py")]
    helper = "=== FILE: lib/params.py ===\n```python\ndef share():\n    return 1.0\n```\n"
    texts = [*misplaced, helper]
    text = "".join(f"<variant {k}>\n{body}</variant {k}>\n" for k, body in enumerate(texts, 1))
    parsed = parse_completion(problem.seed_code, text, len(texts))
    seed = dict(split_files(problem.seed_code))
    for variant in parsed[:2]:
        assert variant.status == "ok", variant.detail
        files = dict(split_files(variant.code))
        assert files["lib/params.py"] == seed["lib/params.py"] and "/ items[i][1]" in files["lib/ranking.py"]
    assert "def share" in dict(split_files(parsed[2].code))["lib/params.py"]  # no block named: the header rules


def test_hostile_header_and_fence_lines_parse_in_linear_time(problem):
    """Found by a red-team pass: two runs of spaces matched by adjacent quantifiers made a header-like line
    (`==FILE:x`, 50,000 spaces, `y`) take 43 s per variant, and a fence opener followed by spaces 0.8 s per 20,000."""
    fill = "```python\ndef fill_fraction():\n    return 1.0\n```\n"
    spaces = " " * 50_000
    for line in (f"==FILE:x{spaces}y", f"```{spaces}y", f"```python{spaces}y"):
        started = time.monotonic()
        parse_completion(problem.seed_code, f"<variant 1>\n{line}\n{fill}</variant 1>", 1)
        assert time.monotonic() - started < 3, line[:12]


def test_the_seed_and_the_two_file_improvement_score_exact_vectors_in_the_process_sandbox(
    problem, children, process_box
):
    outcomes = [process_box.evaluate(problem, code) for code, _ in known(problem, children)]
    assert [o.error for o in outcomes] == [None, None, None]
    assert [o.scores for o in outcomes] == [want for _, want in known(problem, children)]
    seed, both, params_only = (sum(o.scores.values()) / 6 for o in outcomes)
    assert seed < params_only < both and both > 0.97  # the best needs both files changed


def test_hostile_edits_are_refused_and_write_nothing_and_known_programs_still_score_exactly(
    problem, children, process_box, tmp_path
):
    body = "".join(f"<variant {k}>\n{text}</variant {k}>\n" for k, (text, _) in enumerate(HOSTILE_VARIANTS.values(), 1))
    parsed = parse_completion(problem.seed_code, body, len(HOSTILE_VARIANTS))
    assert [v.status for v in parsed] == [status for _, status in HOSTILE_VARIANTS.values()], [v.detail for v in parsed]
    assert all(v.code is None for v in parsed)
    # A program text that names a path outside itself, given to the sandbox directly (not through the parser).
    escape = f"evolve_escape_{uuid.uuid4().hex[:8]}.py"
    files = split_files(problem.seed_code)
    for bad in (f"../{escape}", f"/tmp/{escape}", "lib/extra.py"):
        text = problem.seed_code + f"=== FILE: {bad} ===\nprint('out')\n"
        outcome = process_box.evaluate(problem, text)
        assert outcome.error_kind == ErrorKind.INVALID and set(outcome.scores.values()) == {0.0}, outcome.error
    assert not Path("/tmp", escape).exists()
    with pytest.raises(ValueError, match="stay inside"):
        join_files([*files, ("../x.py", "")])
    assert_known_vectors(process_box, problem, children)


@pytest.mark.docker
def test_the_docker_sandbox_lays_out_the_tree_and_refuses_a_path_outside_it(problem, children):
    box = docker_sandbox_or_skip(workers=1)
    try:
        outside = problem.seed_code + "=== FILE: ../etc/x.py ===\nx = 1\n"
        assert box.evaluate(problem, outside).error_kind == ErrorKind.INVALID
        assert_known_vectors(box, problem, children)
    finally:
        box.close()


@pytest.mark.parametrize(
    ("entry", "link", "wanted"),
    [
        ('"../x.py"', None, "must stay inside the program"),
        ('"/etc/passwd"', None, "must be relative"),
        ('"lib/"', "/etc/passwd", "leads outside the problem folder"),
        ('"seed.py"', None, "no EVOLVE-BLOCK-START in any"),
    ],
)
def test_a_problem_naming_files_outside_itself_is_refused_in_one_line(tmp_path, entry, link, wanted):
    folder = tmp_path / "p"
    (folder / "lib").mkdir(parents=True)
    toml = (EXAMPLE / "problem.toml").read_text().replace('files = ["solver.py", "lib/"]', f"files = [{entry}]")
    (folder / "problem.toml").write_text(toml)
    (folder / "evaluate.py").write_text((EXAMPLE / "evaluate.py").read_text())
    (folder / "seed.py").write_text("def solve(i):\n    return []\n")
    if link is not None:
        (folder / "lib" / "leak.py").symlink_to(link)
    with pytest.raises(ProblemError) as err:
        load_problem(folder)
    assert wanted in str(err.value) and "\n" not in str(err.value)


def test_a_child_that_changes_one_file_of_fifty_stores_one_new_blob(tmp_path):
    files = [(f"part_{i:02d}.py", f"VALUE_{i} = {i}\n") for i in range(50)]
    seed = join_files(files)
    child = join_files([(p, t.replace("= 7", "= 70")) for p, t in files])
    archive = Archive(tmp_path / "a.db")
    try:
        run = archive.create_run("fifty", str(tmp_path), "fp", {}, 0)
        scored = {"scores": {"c0": 1.0}, "scalar": 1.0, "duration_s": 0.1}
        seed_id, _ = store_program(archive, run.id, seed, evaluation=scored)
        child_id, _ = store_program(archive, run.id, child, evaluation=scored, parent_id=seed_id)
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
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine

    from evolve.archive.database import MIGRATIONS
    from evolve.loop import SearchLoop, run_search
    from evolve.runs import open_run
    from policies.replay import ReplayPolicy
    from tests.helpers import SQUARE_SEED
    from tests.test_loop_parts import answer, block, wired

    loop = wired(tmp_path, ["-"], group_size=1, variants=1, max_evaluations=2)
    seed_id, _ = store_program(
        loop.archive,
        loop.run.id,
        SQUARE_SEED,
        evaluation={"scores": {"c0": 0.0, "c1": 0.0}, "scalar": 0.0, "duration_s": 0.1},
    )
    loop.archive.close()
    engine = create_engine(f"sqlite:///{tmp_path / 'a.db'}")
    with engine.begin() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0005_issue24")
    engine.dispose()
    db = sqlite3.connect(tmp_path / "a.db")
    assert "tree_length" not in {row[1] for row in db.execute("PRAGMA table_info(programs)")}
    assert "build_s" not in {row[1] for row in db.execute("PRAGMA table_info(evaluations)")}  # nor 0007's column
    db.close()

    archive = Archive(tmp_path / "a.db")
    try:
        assert archive.codes([seed_id]) == {seed_id: SQUARE_SEED}
        run, resumed = open_run(archive, loop.problem, loop.options)
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
    prompt = build_prompt(PromptInputs("desc", problem.seed_code, {"case_000": 0.5}, None, [], 2, "diff"))
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
        view = problem.config.program.prompt_view
        return build_prompt(
            PromptInputs("desc", problem.seed_code, {}, None, [], 2, "full", language="python", program_view=view)
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
