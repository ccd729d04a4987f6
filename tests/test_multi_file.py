"""Programs of several files (issue 25): the shipped three-file example scores its exact vectors in both
sandboxes, a variant that edits two files applies and scores higher, a hostile edit or program naming a path
outside the program is refused with known programs still scoring exactly afterwards. The archive, the prompt
and the CLI with such programs: tests/test_multi_file_store.py."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from evolve.filetree import join_files, split_files
from evolve.problem import Problem, ProblemError, load_problem
from evolve.problem.outcome import ErrorKind
from evolve.prompts import parse_completion
from sandboxes.process import ProcessSandbox
from tests.helpers import docker_sandbox_or_skip

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
    parsed = parse_completion(problem.seed_code, TWO_FILES, 2, multi_file=problem.multi_file)
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
    [echoed] = parse_completion(problem.seed_code, echo.replace("</variant 2>", ""), 1, multi_file=problem.multi_file)
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
    parsed = parse_completion(problem.seed_code, text, len(bodies), multi_file=problem.multi_file)
    assert [(v.status, v.code) for v in parsed] == [("ok", children[1])] * len(bodies), [v.detail for v in parsed]
    inside = "```python\ndef fill_fraction():\n    # as lib/params.py says\n    # lib/ranking.py\n    return 1.0\n```\n"
    [kept] = parse_completion(problem.seed_code, f"<variant 1>\n{inside}</variant 1>", 1, multi_file=problem.multi_file)
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
    parsed = parse_completion(problem.seed_code, text, len(texts), multi_file=problem.multi_file)
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
        parse_completion(
            problem.seed_code, f"<variant 1>\n{line}\n{fill}</variant 1>", 1, multi_file=problem.multi_file
        )
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
    parsed = parse_completion(problem.seed_code, body, len(HOSTILE_VARIANTS), multi_file=problem.multi_file)
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
