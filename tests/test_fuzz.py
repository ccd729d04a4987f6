"""Property-based fuzzing of the parser and the prompt builder over what models may write.

Random bytes and unicode, EVOLVE markers anywhere, unclosed fences and tags, SEARCH blocks that match twice or
outside the blocks, megabyte outputs: no exception escapes, every variant has a status, and every child the
parser accepts keeps its parent's frame, compiles, and builds the next prompt.
"""

from __future__ import annotations

import ast
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evolve.archive import ChildFailure
from evolve.problem.blocks import END, START, find_blocks, frame_changes
from evolve.prompts import PromptInputs, ShownProgram, build_prompt, parse_completion

pytestmark = pytest.mark.slow

PARENT = (
    "import math\n\n# EVOLVE-BLOCK-START\ndef solve(x):\n    y = x + 1\n    y = x + 1\n    return y\n"
    "# EVOLVE-BLOCK-END\n\n\ndef helper():\n    y = x + 1\n    return 'outside'\n"
)
TWO_BLOCKS = (
    "a = 0\n# EVOLVE-BLOCK-START\nb = 1\n# EVOLVE-BLOCK-END\nc = 2\n# EVOLVE-BLOCK-START\nd = 3\n# EVOLVE-BLOCK-END\n"
)
PARENTS = [PARENT, TWO_BLOCKS, "def solve(x):\n    return x\n"]

LINES = ["    y = x + 1", "    return y", "def solve(x):", "import math", "    return 'outside'", "b = 1", "c = 2"]
FRAGMENTS = [
    f"# {START}",
    f"# {END}",
    "```python\n",
    "```",
    "```py\n",
    "<variant 1>",
    "<variant 2>",
    "</variant 1>",
    "< variant 3 >",
    "<<<<<<< SEARCH\n",
    "=======\n",
    ">>>>>>> REPLACE\n",
    "def solve(x):\n    return x * 2\n",
    "    return y\n",
    "\n",
    "\t",
    "\x00",
    "\ufeff",
    "\u202e",
]


@st.composite
def search_blocks(draw: st.DrawFn) -> str:
    """A SEARCH/REPLACE edit whose SEARCH may match once, twice, outside the block or nowhere."""
    search = "\n".join(draw(st.lists(st.sampled_from(LINES), min_size=1, max_size=3)))
    replace = draw(st.one_of(st.sampled_from(["    y = x * 3", f"    y = 2\n# {END}", f"# {START}\n", ""]), st.text()))
    closing = draw(st.sampled_from([">>>>>>> REPLACE\n", ""]))
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n{closing}"


@st.composite
def completions(draw: st.DrawFn) -> str:
    parts = draw(
        st.lists(
            st.one_of(
                st.sampled_from(FRAGMENTS),
                st.text(max_size=40),
                st.binary(max_size=40).map(lambda b: b.decode("latin-1")),
                search_blocks(),
            ),
            max_size=25,
        )
    )
    return "".join(parts)


def check_variants(parent: str, text: str, m: int) -> None:
    variants = parse_completion(parent, text, m)
    assert [v.slot for v in variants] == list(range(m))
    for v in variants:
        assert v.status in {
            "ok",
            "parse_error",
            "apply_error",
            "outside_block",
            "bad_blocks",
            "syntax_error",
            "unchanged",
        }
        if v.status != "ok":
            assert v.code is None
            continue
        assert v.code is not None and v.code != parent
        assert frame_changes(parent, v.code) is None
        assert len(find_blocks(v.code)) == len(find_blocks(parent))
        ast.parse(v.code)
        prompt = build_prompt(
            PromptInputs("p", v.code, {"a": 1.0}, None, [ShownProgram(parent, {"a": 0.0})], m, "diff")
        )
        assert "# Task" in prompt


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=completions(), parent=st.sampled_from(PARENTS), m=st.integers(1, 4))
def test_parser_never_raises_and_children_keep_the_frame(text, parent, m):
    check_variants(parent, text, m)


@settings(max_examples=200, deadline=None)
@given(text=st.text(), parent=st.sampled_from(PARENTS))
def test_parser_on_arbitrary_unicode(text, parent):
    check_variants(parent, text, 3)


@settings(max_examples=100, deadline=None)
@given(
    code=st.text(),
    feedback=st.one_of(st.none(), st.text()),
    stderr=st.one_of(st.none(), st.text()),
    case_errors=st.dictionaries(st.text(max_size=10), st.text(), max_size=12),
    failures=st.lists(st.builds(ChildFailure, st.sampled_from(["crash", "timeout"]), st.text()), max_size=5),
    edit_format=st.sampled_from(["diff", "full"]),
)
def test_prompt_builder_takes_any_stored_program(code, feedback, stderr, case_errors, failures, edit_format):
    """Any text may sit in an old archive (markers broken included): a prompt is always built, and bounded."""
    prompt = build_prompt(
        PromptInputs(
            "p", code, {"a": 1.0}, feedback, [ShownProgram(code, {"a": 0.0})], 3, edit_format,
            parent_stderr=stderr, parent_case_errors=case_errors, recent_failures=failures,
        )
    )  # fmt: skip
    assert prompt.startswith("# Problem")
    assert len(prompt) <= 3 * len(code) + 12_000


MB = 1 << 20


def test_megabyte_outputs_parse_in_bounded_time():
    """A megabyte of noise, of repeated tags, of SEARCH/REPLACE edits, of END markers in fences, of SEARCH markers
    with no divider and of numbered headings: each parses quickly (those last two took hours: every marker, or
    heading, made the parser scan the text again from there or from its start).

    The whole-program rewrite is a quarter of a megabyte: its one child is valid Python, which the parser and
    these checks parse several times over (a megabyte took 14 s here, all of it in `ast.parse`)."""
    edit = "<<<<<<< SEARCH\n    y = x + 1\n=======\n    y = x * 2\n>>>>>>> REPLACE\n"
    outputs = [
        "x" * MB,
        "<variant 1>" * (MB // 11),
        edit * (MB // len(edit)),
        (f"# {END}\n" + "```\n") * (MB // 30),
        "<<<<<<< SEARCH\n" * (MB // 15),
        "### Variant 1\n```python\n### Variant 2\n" * (MB // 38),
        "```python\n" + "def solve(x):\n    return x\n" * 10_000,
    ]
    for text in outputs:
        assert len(text) >= MB // 4
        started = time.monotonic()
        check_variants(PARENT, text, 3)
        assert time.monotonic() - started < 20, text[:40]


def test_search_matching_twice_edits_the_first_and_outside_is_refused():
    twice = "<variant 1>\n<<<<<<< SEARCH\n    y = x + 1\n=======\n    y = x * 5\n>>>>>>> REPLACE\n</variant 1>"
    (v,) = parse_completion(PARENT, twice, 1)
    assert v.status == "ok" and v.code is not None and v.code.count("y = x * 5") == 1
    outside = "<variant 1>\n<<<<<<< SEARCH\n    return 'outside'\n=======\n    return 1\n>>>>>>> REPLACE\n"
    assert parse_completion(PARENT, outside, 1)[0].status == "outside_block"
    added = f"<variant 1>\n<<<<<<< SEARCH\n    return y\n=======\n    return y\n# {END}\n>>>>>>> REPLACE\n"
    assert parse_completion(PARENT, added, 1)[0].status == "bad_blocks"
