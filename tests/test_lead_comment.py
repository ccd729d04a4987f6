"""The lead comment (`# Change: ...` first in each fenced block of a `full` answer, issue 37): asked in one place
(`evolve.group_sampler.answer_shape`), so that the prompt says it exactly when the grammar holds it; and a copy of the
parent under a new lead comment is still a copy: the parser drops the lead line, so it comes out `unchanged` in
Python and in C, and a copy with one more comment line is a duplicate by its hash in Python."""

from __future__ import annotations

from dataclasses import replace

import pytest

from evolve.archive import code_hash
from evolve.group_sampler import answer_shape
from evolve.options import RunOptions
from evolve.prompts import parse_completion
from evolve.prompts.builder import PromptInputs, build_prompt
from policies.answer_grammar import AnswerShape
from tests.helpers import SQUARE_SEED

C_SEED = "#include <stdio.h>\n// EVOLVE-BLOCK-START\nint f(int x) { return x + 1; }\n// EVOLVE-BLOCK-END\n"
TREE = "=== FILE: main.py ===\n# EVOLVE-BLOCK-START\nx = 1\n# EVOLVE-BLOCK-END\n"
FIXED = "=== FILE: fixed.py ===\nimport main\n"  # a file without blocks


def answer(tag: str, body: str) -> str:
    return f"<variant 1>\n```{tag}\n{body}```\n</variant 1>"


def test_a_copy_of_the_parent_under_a_lead_comment_is_unchanged_in_python_and_in_c():
    python = answer("python", "# Change: nothing at all\ndef solve(x):\n    return x + 1\n")
    c = answer("c", "// Change: nothing at all\nint f(int x) { return x + 1; }\n")
    assert [v.status for v in parse_completion(SQUARE_SEED, python, 1)] == ["unchanged"]
    assert [v.status for v in parse_completion(C_SEED, c, 1)] == ["unchanged"]


def test_a_changed_child_keeps_its_code_without_the_lead_line_and_a_commented_python_copy_is_a_duplicate():
    (child,) = parse_completion(C_SEED, answer("c", "// Change: add two\nint f(int x) { return x + 2; }\n"), 1)
    assert child.status == "ok" and child.code == C_SEED.replace("x + 1", "x + 2")
    commented = answer("python", "# Change: none\n# the same\ndef solve(x):\n    return x + 1\n")
    (copy,) = parse_completion(SQUARE_SEED, commented, 1)
    assert copy.status == "ok" and "# the same" in copy.code and "Change" not in copy.code
    assert code_hash(copy.code) == code_hash(SQUARE_SEED)  # Python is hashed without its comments


def inputs(language: str, lead: str = "", edit_format: str = "full") -> PromptInputs:
    return PromptInputs("Square it.", SQUARE_SEED, {"s": 0.5}, None, [], 2, edit_format, language=language,
                        lead_comment=lead)  # fmt: skip


def test_the_prompt_asks_for_the_lead_comment_with_its_prefix_only_when_it_is_given():
    python, c = build_prompt(inputs("python", "#")), build_prompt(inputs("c", "//"))
    assert "first line of each fenced block is a comment, `# Change: ...`" in python
    assert "first line of each fenced block is a comment, `// Change: ...`" in c and "# Change" not in c
    assert "Change:" not in build_prompt(inputs("python"))
    assert "Change:" not in build_prompt(inputs("python", edit_format="diff"))


@pytest.mark.parametrize(
    ("edit_format", "fence", "parent", "held", "structured", "lead", "shape"),
    [
        ("full", "python", SQUARE_SEED, ("full", "diff"), "auto", True, AnswerShape(2, "full", "python", "#")),
        ("full", "c", C_SEED, ("full",), "on", True, AnswerShape(2, "full", "c", "//")),
        ("full", "rust", C_SEED, ("full",), "on", True, AnswerShape(2, "full", "rust", "//")),
        ("full", "", C_SEED, ("full",), "on", True, AnswerShape(2, "full", "")),  # a bare fence: no lead
        ("full", "haskell", C_SEED, ("full",), "on", True, AnswerShape(2, "full", "haskell")),  # unknown
        ("diff", "python", SQUARE_SEED, ("full", "diff"), "auto", True, AnswerShape(2, "diff", "python")),
        ("full", "python", SQUARE_SEED, ("full", "diff"), "auto", False, AnswerShape(2, "full", "python")),
        ("full", "python", SQUARE_SEED, ("full", "diff"), "off", True, None),
        ("full", "python", SQUARE_SEED, ("diff",), "auto", True, None),
        # a program of several files: the headers of those with blocks; none where no file has any
        ("full", "python", TREE, ("full", "diff"), "auto", True, AnswerShape(2, "full", "python", "#", ("main.py",))),
        ("diff", "python", FIXED + TREE, ("diff",), "on", True, AnswerShape(2, "diff", "python", "", ("main.py",))),
        ("full", "python", FIXED, ("full", "diff"), "auto", True, None),
    ],
)
def test_the_answer_s_shape_and_its_lead_comment_are_decided_in_one_place(
    edit_format, fence, parent, held, structured, lead, shape
):
    options = RunOptions(variants=2, structured=structured, lead_comment=lead)
    several = parent.startswith("=== FILE: ")  # the cases of a problem of several files (its layout, in a run)
    assert answer_shape(options, edit_format, fence, parent, held, several) == shape
    shown = replace(
        inputs(fence, shape.lead_comment if shape else "", edit_format), parent_code=parent, multi_file=several
    )
    assert ("Change:" in build_prompt(shown)) == bool(shape and shape.lead_comment)
