"""A whole rewrite of a program with several blocks, as small models write it: one block only, two blocks in one
fence, blocks out of order, no fence. Each is placed by the names its code defines (evolve/prompts/block_match.py)."""

from __future__ import annotations

import time
from pathlib import Path

from evolve.filetree import tree_files
from evolve.problem import load_problem
from evolve.prompts import build_prompt, parse_completion
from evolve.prompts.block_match import defined_names
from evolve.prompts.builder import PromptInputs

PARENT = (
    "import math\n\n# EVOLVE-BLOCK-START\ndef fill():\n    return 0.6\n# EVOLVE-BLOCK-END\n\n\n"
    "def fixed():\n    return 1\n\n\n# EVOLVE-BLOCK-START\ndef order(items):\n    return sorted(items)\n"
    "# EVOLVE-BLOCK-END\n"
)
KNAPSACK = Path(__file__).resolve().parents[1] / "problems" / "knapsack_files"


def child(parent: str, text: str, multi_file: bool = False) -> tuple[str, str | None]:
    variant = parse_completion(parent, f"<variant 1>\n{text}\n</variant 1>", 1, multi_file=multi_file)[0]
    return variant.status, variant.code


def test_one_fence_rewrites_the_block_whose_function_it_defines_and_keeps_the_other():
    status, code = child(PARENT, "```python\ndef order(items):\n    return sorted(items, reverse=True)\n```")
    assert status == "ok"
    assert code == PARENT.replace("return sorted(items)", "return sorted(items, reverse=True)")


def test_one_fence_with_both_functions_is_cut_between_them_with_helpers_kept_beside_their_user():
    text = (
        "```python\ndef fill():\n    return 0.9\n\n\nimport random\n\n\ndef order(items):\n"
        "    return random.sample(items, len(items))\n```"
    )
    status, code = child(PARENT, text)
    assert status == "ok"
    assert code == PARENT.replace("return 0.6", "return 0.9").replace(
        "def order(items):\n    return sorted(items)\n",
        "import random\n\n\ndef order(items):\n    return random.sample(items, len(items))\n",
    )


def test_blocks_out_of_order_and_bare_code_land_on_their_own_blocks():
    swapped = "```python\ndef order(items):\n    return items\n```\n```python\ndef fill():\n    return 1.0\n```"
    assert child(PARENT, swapped) == ("ok", PARENT.replace("0.6", "1.0").replace("sorted(items)", "items"))
    bare = "def order(items):\n    return items[::-1]\n"
    assert child(PARENT, bare) == ("ok", PARENT.replace("sorted(items)", "items[::-1]"))


def test_what_names_no_block_or_splits_one_is_still_refused():
    assert child(PARENT, "```python\ndef helper():\n    return 2\n```")[0] == "parse_error"
    split = "```python\ndef fill():\n    return 1\n\ndef order(x):\n    return x\n\nfill = 3\n```"
    assert child(PARENT, split)[0] == "parse_error"  # fill's statements on both sides of order's


def test_a_c_function_is_known_by_its_head():
    parent = (
        "#include <stdio.h>\n// EVOLVE-BLOCK-START\nstatic int step(int x) {\n    return x + 1;\n}\n"
        "// EVOLVE-BLOCK-END\nint twice(int x) { return 2 * x; }\n// EVOLVE-BLOCK-START\nint main(void) {\n"
        '    printf("%d\\n", step(1));\n    return 0;\n}\n// EVOLVE-BLOCK-END\n'
    )
    status, code = child(parent, "```c\nstatic int step(int x) {\n    return x * 3;\n}\n```")
    assert status == "ok"
    assert code == parent.replace("return x + 1;", "return x * 3;")


def test_the_multi_file_example_takes_one_file_rewritten_without_its_header():
    seed = load_problem(KNAPSACK).seed_code
    status, code = child(seed, "```python\ndef order(items):\n    return sorted(range(len(items)))\n```", True)
    assert status == "ok"
    before, after = dict(tree_files(seed) or []), dict(tree_files(code or "") or [])
    assert [p for p in before if before[p] != after[p]] == ["lib/ranking.py"]
    assert "return sorted(range(len(items)))" in after["lib/ranking.py"]


def test_the_multi_file_prompt_gives_one_rule_for_fences():
    problem = load_problem(KNAPSACK)
    text = build_prompt(
        PromptInputs(
            problem.config.description, problem.seed_code, {}, None, [], 3, "full", language="python", multi_file=True
        )
    )
    assert "=== FILE: lib/params.py ===" in text
    assert "fenced blocks, in order holding" not in text  # the one-file rule by position contradicted the files'
    # the fixed file first, the files to change last, nearest the answer: shown last, a 0.5B model rewrote solver.py
    shown = text.index("# Current program")
    assert (
        text.index("=== FILE: solver.py", shown)
        < text.index("=== FILE: lib/params.py", shown)
        < text.index("# Your answer")
    )


def test_a_hostile_line_is_read_in_linear_time():
    """A C function head was matched by two overlapping star runs: 20,000 stars after a word took 15 s."""
    started = time.monotonic()
    assert defined_names("a" + "*" * 200_000 + "\n" + "static " * 50_000 + "\n") == set()
    assert time.monotonic() - started < 3


def test_a_renamed_function_goes_to_the_block_with_the_same_parameters_under_its_old_name():
    status, code = child(PARENT, "```python\ndef rank(items):\n    return sorted(items, key=len)\n```")
    assert (status, code) == ("ok", PARENT.replace("return sorted(items)", "return sorted(items, key=len)"))
    # no parameters in common with one block only: which block was meant is a guess
    assert child(PARENT, "```python\ndef rank(a, b):\n    return a\n```")[0] == "parse_error"
