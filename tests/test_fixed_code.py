"""The code around a one-file program's EVOLVE blocks is shown once in its prompt, read-only and before the task,
so a small model sees how its editable code is called (evolve/problem/fixed_code.py)."""

from __future__ import annotations

from pathlib import Path

from evolve.archive import Archive
from evolve.loop import SearchLoop, run_search
from evolve.options import RunOptions
from evolve.problem import load_problem
from evolve.problem.fixed_code import fixed_code_view
from evolve.prompts import PromptInputs, build_prompt
from evolve.runs import open_run
from policies.replay import ReplayPolicy
from sandboxes.process import ProcessSandbox
from tests.helpers import SQUARE_TOML, db_rows, write_problem

ROOT = Path(__file__).resolve().parent.parent
HEADING = "# Fixed code of the program"
HELPER_SEED = """import math


def helper(x):
    return math.floor(x)

# EVOLVE-BLOCK-START
def solve(x):
    return helper(x) + 1
# EVOLVE-BLOCK-END


def main(x):
    return solve(x)
"""


def _prompt(code: str, fixed: bool, tag: str | None = None) -> str:
    return build_prompt(
        PromptInputs("Pack well.", code, {"s": 1.0}, None, [], 3, "full", language=tag, fixed_code=fixed)
    )


def test_bin_packing_s_prompt_shows_how_solve_uses_the_scores_of_priority_before_the_task():
    seed = load_problem(ROOT / "problems" / "bin_packing").seed_code
    text = _prompt(seed, fixed=True)
    fixed = text.split(HEADING, 1)[1].split("# Task", 1)[0]
    assert "scores = priority(item, [bins[i] for i in fits])" in fixed
    assert "key=lambda k: scores[k]" in fixed
    assert '# [the editable code, block 1: shown under "Current program"]' in fixed
    assert "return [-i for i in range(len(remaining))]" not in fixed  # the editable code is not in it
    assert "EVOLVE-BLOCK" not in fixed
    assert text.index(HEADING) < text.index("# Task") < text.index("# Current program")
    assert HEADING not in _prompt(seed, fixed=False)


def test_the_fixed_section_is_the_same_for_every_program_of_a_run_so_the_prompt_cache_keeps_it():
    seed = load_problem(ROOT / "problems" / "bin_packing").seed_code
    child = seed.replace("return [-i for i in range(len(remaining))]", "return [-free for free in remaining]")
    first, second = _prompt(seed, True), _prompt(child, True)
    head = first.index("# Current program")
    assert first[:head] == second[:head] and HEADING in first[:head]


def test_a_program_without_fixed_code_shows_no_section():
    assert fixed_code_view("def solve(x):\n    return x\n", "#") is None  # no markers: all of it editable
    only_block = "\n\n# EVOLVE-BLOCK-START\ndef solve(x):\n    return x\n# EVOLVE-BLOCK-END\n\n"
    assert fixed_code_view(only_block, "#") is None
    assert HEADING not in _prompt(only_block, fixed=True)
    broken = "# EVOLVE-BLOCK-END\ndef solve(x):\n    return x\n"
    assert fixed_code_view(broken, "#") is None


def test_c_code_gets_a_c_comment_and_blank_runs_are_squeezed():
    code = load_problem(ROOT / "problems" / "roman_numerals_c").seed_code
    view = fixed_code_view(code, "//")
    assert view is not None and '// [the editable code, block 1: shown under "Current program"]' in view
    assert "solve(n, out);" in view and "\n\n\n" not in view


def test_a_long_harness_shrinks_to_the_lines_around_each_use_of_an_editable_name():
    filler = "".join(f"def unrelated_{i}(v):\n    return v + {i}\n\n" for i in range(200))
    code = HELPER_SEED + filler + "def run_all(xs):\n    return [solve(x) for x in xs]\n"
    view = fixed_code_view(code, "#", budget=1200)
    assert view is not None and len(view) <= 1200
    assert "return [solve(x) for x in xs]" in view and "return solve(x)" in view
    assert "# [the editable code, block 1" in view
    assert "unrelated_100" not in view and "# ..." in view


def test_the_run_option_puts_the_section_in_the_loop_s_prompts_and_off_leaves_it_out(tmp_path):
    problem = load_problem(write_problem(tmp_path / "p", seed=HELPER_SEED, toml=SQUARE_TOML))
    answer = "<variant 1>\n```python\ndef solve(x):\n    return helper(x) * 2\n```\n</variant 1>"
    assert RunOptions().fixed_code is True
    for shown in (True, False):
        archive = Archive(tmp_path / f"{shown}.db")
        options = RunOptions(
            workers=1, group_size=1, variants=1, max_evaluations=100, max_groups=1, structured="off",
            asks="base", fixed_code=shown,
        )  # fmt: skip
        run = open_run(archive, problem, options).run
        loop = SearchLoop(problem, archive, ReplayPolicy([answer]), ProcessSandbox(1), run, options)
        run_search(loop)
        archive.close()
        [(text,)] = db_rows(tmp_path / f"{shown}.db", "SELECT text FROM prompts")
        assert (HEADING in text) is shown
        assert ("def main(x):\n    return solve(x)" in text) is shown


def test_a_shrunk_view_is_the_same_whatever_names_the_parent_s_blocks_define():
    """Past the budget the view keeps the lines around calls the fixed code makes to names it does not define,
    read from the fixed code alone: a child whose block defines one more function (a name the fixed code also
    uses as a local) gets the same view, so the prompt cache still holds it."""
    filler = "".join(f"def f{i}(a):\n    fits = a + {i}\n    return fits\n\n" for i in range(120))
    frame = "def solve(items):\n    fits = [x for x in items]\n    return priority(fits)\n\n" + filler
    parent = f"# EVOLVE-BLOCK-START\ndef priority(v):\n    return v\n# EVOLVE-BLOCK-END\n\n{frame}"
    child = parent.replace("    return v\n", "    return fits(v)\n\ndef fits(v):\n    return v\n")
    view = fixed_code_view(parent, "#")
    assert view is not None and view == fixed_code_view(child, "#")
    assert "return priority(fits)" in view and "return a + 119" not in view
