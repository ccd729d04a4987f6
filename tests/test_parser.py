"""A corpus of messy model outputs: each variant gets the right status and never raises."""

from __future__ import annotations

import pytest

from evolve.prompts import PromptInputs, ShownProgram, build_prompt, parse_completion

PARENT = """import math

# EVOLVE-BLOCK-START
def solve(x):
    y = x + 1
    return y
# EVOLVE-BLOCK-END


def helper():
    return "outside"
"""

TWO_BLOCKS = (
    "a = 0\n# EVOLVE-BLOCK-START\nb = 1\n# EVOLVE-BLOCK-END\nc = 2\n# EVOLVE-BLOCK-START\nd = 3\n# EVOLVE-BLOCK-END\n"
)

DIFF = "<<<<<<< SEARCH\n    y = x + 1\n=======\n    y = x * 2\n>>>>>>> REPLACE"

CORPUS = [
    # (name, completion, m, expected statuses, substring the first child must contain)
    ("clean diff", f"<variant 1>\n{DIFF}\n</variant 1>", 1, ["ok"], "y = x * 2"),
    ("diff inside a fence", f"<variant 1>\n```python\n{DIFF}\n```\n</variant 1>", 1, ["ok"], "y = x * 2"),
    (
        "missing closing tags",
        f"<variant 1>\n{DIFF}\n<variant 2>\n{DIFF.replace('* 2', '* 3')}",
        2,
        ["ok", "ok"],
        "y = x * 2",
    ),
    (
        "missing REPLACE marker",
        "<variant 1>\n<<<<<<< SEARCH\n    y = x + 1\n=======\n    y = x - 5\n",
        1,
        ["ok"],
        "y = x - 5",
    ),
    (
        "indentation drift",
        "<variant 1>\n<<<<<<< SEARCH\ny = x + 1\nreturn y\n=======\ny = x ** 3\nreturn y\n"
        ">>>>>>> REPLACE\n</variant 1>",
        1,
        ["ok"],
        "    y = x ** 3\n    return y",
    ),
    (
        "trailing whitespace",
        "<variant 1>\n<<<<<<< SEARCH\n    y = x + 1   \n=======\n    y = 7\n>>>>>>> REPLACE",
        1,
        ["ok"],
        "y = 7",
    ),
    (
        "full rewrite fence",
        "<variant 1>\n```python\ndef solve(x):\n    return 42\n```\n</variant 1>",
        1,
        ["ok"],
        "return 42",
    ),
    ("whole file echoed", "<variant 1>\n```python\n" + PARENT.replace("x + 1", "x + 9") + "```", 1, ["ok"], "x + 9"),
    (
        "untagged single variant",
        "Sure! Here it is:\n```py\ndef solve(x):\n    return -x\n```",
        3,
        ["ok", "parse_error", "parse_error"],
        "return -x",
    ),
    (
        "edit outside the block",
        '<variant 1>\n<<<<<<< SEARCH\n    return "outside"\n=======\n    return 1\n>>>>>>> REPLACE',
        1,
        ["outside_block"],
        None,
    ),
    (
        "search text not found",
        "<variant 1>\n<<<<<<< SEARCH\n    z = 99\n=======\n    z = 1\n>>>>>>> REPLACE",
        1,
        ["apply_error"],
        None,
    ),
    ("syntax error", "<variant 1>\n```python\ndef solve(x)\n    return (\n```", 1, ["syntax_error"], None),
    (
        "no change",
        "<variant 1>\n<<<<<<< SEARCH\n    y = x + 1\n=======\n    y = x + 1\n>>>>>>> REPLACE",
        1,
        ["unchanged"],
        None,
    ),
    (
        "bare code in the tag",
        "<variant 1>\n    def solve(x):\n        return x - 1\n</variant 1>",
        1,
        ["ok"],
        "def solve(x):\n    return x - 1",
    ),
    ("prose only", "<variant 1>I would make it faster.</variant 1>", 1, ["parse_error"], None),
    ("empty completion", "", 2, ["parse_error", "parse_error"], None),
    (
        "more variants than asked",
        "".join(f"<variant {k}>\n```python\ndef solve(x):\n    return {k}\n```\n</variant {k}>" for k in range(1, 6)),
        3,
        ["ok", "ok", "ok"],
        "return 1",
    ),
    (
        "odd tag spacing",
        "< Variant 1 >\n```python\ndef solve(x):\n    return 5\n```\n</ variant 1>",
        1,
        ["ok"],
        "return 5",
    ),
    (
        "untagged variants under comment headings in one fence",
        "```python\n# Variant 1: a fix\ndef solve(x):\n    return x * 2\n\n# Variant 2: another method\n"
        "def solve(x):\n    return x * 3\n```\nBoth should score better.",
        2,
        ["ok", "ok"],
        "return x * 2",
    ),
    (
        "untagged variants under markdown headings",
        "Sure.\n\n#### Variant 1: careful\n**Code:**\n```python\ndef solve(x):\n    return 7\n```\n\n"
        "#### Variant 2: bolder\n```python\ndef solve(x):\n    return 8\n```\nDone.",
        3,
        ["ok", "ok", "parse_error"],
        "return 7",
    ),
    (
        "one heading is not a split",
        "### Variant 1\n```python\ndef solve(x):\n    return 11\n```",
        2,
        ["ok", "parse_error"],
        "return 11",
    ),
    (
        "renamed entry point",
        "<variant 1>\n```python\ndef compute_value(x):\n    return x * 5\n```\n</variant 1>",
        1,
        ["ok"],
        "def solve(x):\n    return x * 5",
    ),
    (
        "renamed entry point otherwise unchanged",
        "<variant 1>\n```python\ndef solve_it(x):\n    y = x + 1\n    return y\n```\n</variant 1>",
        1,
        ["unchanged"],
        None,
    ),
    ("garbage bytes", "<variant 1>\x00\x01<<<<<<< SEARCH\n=======\n>>>>>>> REPLACE", 1, ["apply_error"], None),
]


@pytest.mark.parametrize("name,text,m,statuses,needle", CORPUS, ids=[c[0] for c in CORPUS])
def test_corpus(name, text, m, statuses, needle):
    parsed = parse_completion(PARENT, text, m)
    assert [v.status for v in parsed] == statuses
    assert [v.slot for v in parsed] == list(range(m))
    if needle:
        assert needle in parsed[0].code
        assert parsed[0].code.endswith('def helper():\n    return "outside"\n')  # outside text kept exactly
    for v in parsed:
        assert (v.code is not None) == (v.status == "ok")


def test_two_blocks_full_rewrite_needs_both_unless_names_tell_the_block():
    stray = parse_completion(TWO_BLOCKS, "<variant 1>\n```python\nz = 10\n```", 1)[0]
    assert stray.status == "parse_error"  # defines no block's name: which block it rewrites is a guess
    one = parse_completion(TWO_BLOCKS, "<variant 1>\n```python\nd = 10\n```", 1)[0]
    assert one.code == TWO_BLOCKS.replace("d = 3", "d = 10")  # the block that defines `d`, the other kept
    both = parse_completion(TWO_BLOCKS, "<variant 1>\n```python\nb = 10\n```\n```python\nd = 30\n```", 1)[0]
    assert (
        both.code == "a = 0\n# EVOLVE-BLOCK-START\nb = 10\n# EVOLVE-BLOCK-END\nc = 2\n# EVOLVE-BLOCK-START\n"
        "d = 30\n# EVOLVE-BLOCK-END\n"
    )


def test_prompt_carries_vector_feedback_inspirations_and_the_ask():
    text = build_prompt(
        PromptInputs(
            "Do the thing.",
            PARENT,
            {"n22": 1.5, "n23": 2.25},
            "circles overlap",
            [ShownProgram("def solve(x):\n    return 0\n", {"n22": 0.1, "n23": 0.2})],
            3,
            "diff",
        )
    )
    for piece in (
        "Do the thing.",
        "n22=1.5",
        "n23=2.25",
        "circles overlap",
        "Other program 1",
        "n22=0.1",
        "<variant 3>",
        "SEARCH",
        "y = x + 1",
    ):
        assert piece in text
    assert "helper" not in text  # only the editable blocks are shown


def test_a_rename_is_undone_only_when_it_is_unambiguous():
    two_new = "<variant 1>\n```python\ndef a(x):\n    return 1\n\ndef b(x):\n    return a(x)\n```"
    (kept,) = parse_completion(PARENT, two_new, 1)
    assert kept.status == "ok" and "def solve" not in kept.code and kept.detail is None
    calls_itself = "<variant 1>\n```python\ndef fact(x):\n    return 1 if x < 2 else x * fact(x - 1)\n```"
    (renamed,) = parse_completion(PARENT, calls_itself, 1)
    assert "def solve(x):\n    return 1 if x < 2 else x * solve(x - 1)" in renamed.code
    assert renamed.detail == "renamed fact back to solve"
    assert renamed.code.endswith('def helper():\n    return "outside"\n')
