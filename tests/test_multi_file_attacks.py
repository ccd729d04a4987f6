"""Red-team checks on programs of several files (issue 25): each closes a hole found by attacking the joined
text form, and proves containment by scoring the example's known programs to their exact vectors afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolve.archive import Archive
from evolve.archive.codehash import normalized_hash
from evolve.filetree import TreeError, check_path, split_files, tree_files
from evolve.problem import ProblemError, load_problem
from evolve.problem.outcome import ErrorKind
from tests.helpers import store_program
from tests.test_multi_file import EXAMPLE, assert_known_vectors, children, problem, process_box  # noqa: F401

SCORED = {"scores": {"c0": 1.0}, "scalar": 1.0, "duration_s": 0.1}


@pytest.mark.parametrize("path", ["a.py\n", "lib\n/a.py", "lib/a.py\n"])
def test_a_path_part_ending_in_a_newline_is_refused(path):
    """`$` also matches before a final newline: a part 'a.py\\n' passed the rules and broke the header."""
    with pytest.raises(TreeError):
        check_path(path)


def test_a_problem_file_whose_name_ends_in_a_newline_is_refused_in_one_line(tmp_path):
    folder = tmp_path / "p"
    (folder / "lib").mkdir(parents=True)
    for name in ("problem.toml", "evaluate.py", "solver.py", "lib/params.py", "lib/ranking.py"):
        (folder / name).write_text((EXAMPLE / name).read_text())
    (folder / "lib" / "extra.py\n").write_text("X = 1\n")
    with pytest.raises(ProblemError) as err:
        load_problem(folder)
    assert "\n" not in str(err.value) and "extra.py" in str(err.value)


def test_a_header_that_ends_the_text_reads_back_from_the_archive_as_evaluated(tmp_path):
    """A last header with no newline after it split as an empty file and was stored as one; the archive joined
    it back with a newline the evaluated text never had. Such a text is now no program of several files."""
    code = "=== FILE: a.py ===\nx = 1\n=== FILE: b.py ==="
    with pytest.raises(TreeError, match="newline"):
        split_files(code)
    assert tree_files(code) is None
    archive = Archive(tmp_path / "a.db")
    try:
        run = archive.create_run("tail", str(tmp_path), "fp", {}, 0)
        pid, _ = store_program(archive, run.id, code, evaluation=SCORED)
        assert archive.codes([pid]) == {pid: code}
        assert archive.program(pid).code == code
    finally:
        archive.close()


def test_a_header_that_ends_the_text_is_invalid_and_known_programs_still_score_exactly(
    problem,  # noqa: F811
    children,  # noqa: F811
    process_box,  # noqa: F811
):
    files = split_files(problem.seed_code)
    last = files[-1][0]
    head = problem.seed_code[: problem.seed_code.index(f"=== FILE: {last} ===")]
    outcome = process_box.evaluate(problem, f"{head}=== FILE: {last} ===")
    assert outcome.error_kind == ErrorKind.INVALID and "newline" in (outcome.error or "")
    assert_known_vectors(process_box, problem, children)


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ('{"fill": 0.5}\n', "{'fill': 0.5}\n"),  # JSON and not JSON: ast.unparse wrote both the same
        ("x = 'a\\nb'\n", 'x = "a\\nb"\n'),  # TOML: a literal backslash-n, then a newline
        ("1.0\n", "1.00\n"),
        ("(3)\n", "3\n"),  # int() reads one and not the other
    ],
)
def test_data_files_of_different_text_hash_apart(one, other):
    """Only .py files are Python: normalising a data file as Python merged different programs into one."""
    base = "=== FILE: solver.py ===\nx = 1\n=== FILE: params.data ===\n"
    assert normalized_hash(base + one, multi_file=True) != normalized_hash(base + other, multi_file=True)
    py = "=== FILE: solver.py ===\n"
    assert normalized_hash(py + "x = 1  # a\n", multi_file=True) == normalized_hash(py + "x = 1\n", multi_file=True)


def test_a_docstring_spelling_a_header_does_not_hash_as_a_second_file():
    """ast.unparse writes a docstring's escaped newlines as real ones, so a header spelt inside one could
    stand, in the normalised text, where the next file's header stood: two file lists, one hash."""
    two = '=== FILE: a.py ===\n"""x\n=== FILE: b.py ===\ny"""\n'  # neither file parses: kept as written
    one = "=== FILE: a.py ===\n'''x\\n=== FILE: b.py ===\\ny'''\n"  # one file: a docstring with escapes
    assert tree_files(one) is not None and len(tree_files(one)) == 1  # type: ignore[arg-type]
    assert normalized_hash(one, multi_file=True) != normalized_hash(two, multi_file=True)


def test_the_example_problem_still_loads(problem):  # noqa: F811
    assert Path(EXAMPLE).is_dir() and problem.files == ("solver.py", "lib/params.py", "lib/ranking.py")


def test_a_lone_surrogate_from_the_model_becomes_a_replacement_character():
    """JSON-decoded model text may hold a lone surrogate: the archive (completion and program rows) and the
    sandbox's UTF-8 file writes raised on it, failing the commit or the evaluation as a sandbox bug."""
    from policies.policy import Generated

    gen = Generated("x = '\ud800'\n", None, None, "stop", 0)
    assert gen.text == "x = '\ufffd'\n" and gen.text.encode("utf-8")


def test_a_program_holding_a_lone_surrogate_is_invalid_and_known_programs_still_score_exactly(
    problem,  # noqa: F811
    children,  # noqa: F811
    process_box,  # noqa: F811
):
    code = problem.seed_code.replace("def ", "# \ud800\ndef ", 1)
    outcome = process_box.evaluate(problem, code)  # raised UnicodeEncodeError from the work folder's write
    assert outcome.error_kind == ErrorKind.INVALID and "UTF-8" in (outcome.error or "")
    assert_known_vectors(process_box, problem, children)
