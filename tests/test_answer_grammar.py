"""The answer's grammar, run in llama.cpp's own grammar engine over a byte-level vocabulary (one token a
character): every answer the prompt asks for is accepted and parses into m changed children; the shapes the
parser dropped (prose headings, a tag with no code, a missing or extra variant, a line of prose or of code before
the fence, the closing tag inside an open fence) are refused at the character where they go wrong. With a lead
comment asked (`AnswerShape.lead_comment`), each fenced block opens with `<prefix> Change: <text>`, at most one more
comment line, then a line of code: a block without it, a comment-only block and a run of comments are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolve.prompts import parse_completion
from policies.answer_grammar import AnswerShape, answer_gbnf
from tests.helpers import SQUARE_SEED, need_llama

FULL = """<variant 1>
```python
def solve(x):
    return x * x
```
</variant 1>

<variant 2>
```python
def solve(x):
    # `x` squared, with a backtick in a comment and <b> in a string
    return x ** 2  # "</b>"
```
</variant 2>"""

DIFF = """<variant 1>
<<<<<<< SEARCH
    return x + 1
=======
    return x * x
>>>>>>> REPLACE
</variant 1>"""


@pytest.fixture(scope="module")
def llama_vocab(tiny_gguf):
    need_llama()
    from transformers import AutoTokenizer

    from policies.llama_runtime import llama_module

    lib = llama_module()
    model = lib.llama_model_load_from_file(str(tiny_gguf).encode(), lib.llama_model_default_params())
    yield lib, lib.llama_model_get_vocab(model), AutoTokenizer.from_pretrained(tiny_gguf.parent)
    lib.llama_model_free(model)


@pytest.fixture(scope="module")
def book(llama_vocab):
    from policies.llama_grammar import GrammarBook

    lib, vocab, tokenizer = llama_vocab
    grammars = GrammarBook(lib, vocab, lib.llama_vocab_n_tokens(vocab), {tokenizer.eos_token_id})
    yield grammars, tokenizer
    grammars.close()


def refused_at(book, shape: AnswerShape, text: str) -> int | None:
    """Where the grammar of `shape` first refuses `text` (a character offset; len(text) when all of it is taken
    but the answer is not complete there), or None when it takes all of it and may end there."""
    import numpy as np

    grammars, tokenizer = book
    row = grammars.row(answer_gbnf(shape))
    try:
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert len(ids) == len(text.encode())  # one token a byte: offsets are characters of this ASCII text
        for at, token in enumerate(ids):
            if not row.allowed(np.array([token]))[0]:
                return at
            row.accept(token)
        return None if row.allowed(np.array([tokenizer.eos_token_id]))[0] else len(text)
    finally:
        row.close()


def test_well_formed_answers_are_taken_whole_and_parse_into_changed_children(book):
    for shape, text, m in ((AnswerShape(2, "full", "python"), FULL, 2), (AnswerShape(1, "diff"), DIFF, 1)):
        assert refused_at(book, shape, text) is None
        assert [v.status for v in parse_completion(SQUARE_SEED, text, m)] == ["ok"] * m
    bare = FULL.replace("```python", "```").split("\n\n<variant 2>")[0]
    assert refused_at(book, AnswerShape(1, "full", ""), bare) is None
    two_blocks = "<variant 1>\n```c\nint a;\n```\n```c\nint b;\n```\n</variant 1>"
    assert refused_at(book, AnswerShape(1, "full", "c"), two_blocks) is None
    two_edits = DIFF.replace("</variant 1>", DIFF.split("\n", 1)[1].replace("x * x", "x ** 2"))
    assert refused_at(book, AnswerShape(1, "diff"), two_edits) is None
    # the parser reads an indented fence close or divider, fenced code under `diff`, and a doctest line as code
    indented = FULL.replace("```\n</variant 1>", "    ```\n</variant 1>").replace("=======", "  =======")
    assert refused_at(book, AnswerShape(2, "full", "python"), indented) is None
    assert [v.status for v in parse_completion(SQUARE_SEED, indented, 2)] == ["ok", "ok"]
    rewrite = FULL.split("\n\n<variant 2>")[0]
    assert refused_at(book, AnswerShape(1, "diff", "python"), rewrite) is None
    doctest = DIFF.replace("    return x * x\n", "    >>> solve(3)\n    return x * x\n")
    assert refused_at(book, AnswerShape(1, "diff"), doctest) is None


@pytest.mark.parametrize(
    ("shape", "text", "where"),
    [
        (AnswerShape(2, "full", "python"), "### Variant 1\n" + FULL, "#"),
        (AnswerShape(2, "full", "python"), FULL.replace("```python\ndef solve(x):\n    return x * x\n```\n", ""), "<"),
        (AnswerShape(2, "full", "python"), FULL.replace("<variant 1>\n", "<variant 1>\nSquare it.\n"), "S"),
        (AnswerShape(2, "full", "python"), FULL.replace("```python\ndef solve(x):", "def solve(x):\n```python"), "d"),
        (AnswerShape(1, "diff"), DIFF.replace("<variant 1>\n", "<variant 1>\nAn edit:\n"), "A"),
        (AnswerShape(2, "full", "python"), FULL.replace("```python", "```py\n"), "\n"),
        (AnswerShape(2, "full", "python"), FULL.replace("```\n</variant 1>", "</variant 1>\n```"), "/"),
        (AnswerShape(2, "full", "python"), FULL.replace("</variant 1>\n\n", "</variant 1>\n\n\n"), "\n"),
        (AnswerShape(2, "full", "python"), FULL.replace("```\n</variant 1>\n\n", ""), "t"),
        (AnswerShape(1, "diff"), DIFF.replace("=======\n", ""), ">"),
        (AnswerShape(1, "diff"), DIFF.replace("=======\n", "    >>>>> REPLACE\n"), ">"),
        (AnswerShape(1, "diff", "python"), DIFF.replace("<<<<<<< SEARCH\n", "```python\n<<<<<<< SEARCH\n"), "<"),
    ],
    ids=["prose-heading", "tag-without-code", "line-of-idea", "code-before-fence", "idea-before-edit", "wrong-fence",
         "tag-inside-fence",
         "blank-lines", "next-tag-inside-fence", "edit-without-divider", "indented-marker", "edit-inside-fence"],
)  # fmt: skip
def test_the_shapes_the_parser_dropped_are_refused_where_they_go_wrong(book, shape, text, where):
    at = refused_at(book, shape, text)
    assert at is not None and at < len(text)
    assert text[at] == where


def test_an_answer_missing_a_variant_may_not_end_and_one_more_is_refused(book):
    shape = AnswerShape(2, "full", "python")
    first = FULL.split("\n\n<variant 2>")[0]
    assert refused_at(book, shape, first) == len(first)  # taken, but no end-of-turn yet
    third = FULL + "\n" + FULL.split("\n\n")[1].replace("variant 2", "variant 3")
    assert refused_at(book, shape, third) == len(FULL)  # after </variant 2> nothing more, not even a newline


@pytest.mark.parametrize(
    "kwargs", [{"variants": 0, "edit_format": "full"}, {"variants": 1, "edit_format": "auto"},
               {"variants": 1, "edit_format": "full", "language": 'py"\n'}],
)  # fmt: skip
def test_a_shape_without_a_grammar_is_refused_when_made(kwargs):
    with pytest.raises(ValueError):
        AnswerShape(**kwargs)


def test_an_end_token_is_allowed_only_where_both_the_grammar_and_the_policy_end(llama_vocab):
    """The tiny model's pad token is no end of generation for llama.cpp: as text ("<|pad|>") a code line may hold
    it; named as an end of turn by the policy, it would end a row inside its code, so it is refused there."""
    import numpy as np

    from policies.llama_grammar import GrammarBook

    lib, vocab, tokenizer = llama_vocab
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    inside_code = FULL[: FULL.index("def solve")]
    for ends, pad_allowed in (({eos}, True), ({eos, pad}, False)):
        grammars = GrammarBook(lib, vocab, lib.llama_vocab_n_tokens(vocab), ends)
        row = grammars.row(answer_gbnf(AnswerShape(2, "full", "python")))
        for token in tokenizer(inside_code, add_special_tokens=False).input_ids:
            row.accept(token)
        assert row.allowed(np.array([pad, eos])).tolist() == [pad_allowed, False]  # no end inside the code
        row.close()
        grammars.close()


# ---- the lead comment: `# Change: ...` first in each fenced block ------------------------------------------------
LEAD_PY, LEAD_C = AnswerShape(1, "full", "python", "#"), AnswerShape(1, "full", "c", "//")
LEAD = """<variant 1>
```python
# Change: square it
def solve(x):
    return x * x
```
</variant 1>"""
LEAD_IN_C = "<variant 1>\n```c\n// Change: one more\n// why\nint f(int x) { return x + 2; }\n```\n</variant 1>"


def test_a_lead_comment_one_more_comment_line_and_the_code_are_taken_and_parse_as_code_alone(book):
    assert refused_at(book, LEAD_PY, LEAD) is None
    assert refused_at(book, LEAD_PY, LEAD.replace("it\n", "it\n# x * x, not x + 1\n")) is None
    assert refused_at(book, LEAD_C, LEAD_IN_C) is None
    blocks = "<variant 1>\n```c\n// Change: a\n  int a;\n\n```\n```c\n// Change: b\nint b;\n```\n</variant 1>"
    assert refused_at(book, LEAD_C, blocks) is None
    two = LEAD + "\n\n" + LEAD.replace("variant 1", "variant 2").replace("square it", "x ** 2")
    assert refused_at(book, AnswerShape(2, "full", "python", "#"), two) is None
    (parsed,) = parse_completion(SQUARE_SEED, LEAD, 1)
    assert parsed.status == "ok" and "Change" not in parsed.code and "return x * x" in parsed.code


@pytest.mark.parametrize(
    ("shape", "text", "where"),
    [
        (LEAD_PY, LEAD.replace("# Change: square it\n", ""), "d"),
        (LEAD_PY, LEAD.replace("square it", ""), "\n"),
        (LEAD_PY, LEAD.replace("# Change: ", "# Change:"), "s"),
        (LEAD_PY, LEAD.replace("# Change: ", "# change: "), "c"),
        (LEAD_PY, LEAD.replace("# Change: ", "// Change: "), "/"),
        (LEAD_C, LEAD_IN_C.replace("// Change: ", "# Change: "), "#"),
        (LEAD_PY, LEAD.replace("it\n", "it\n# one\n# two\n"), "#"),
        (LEAD_PY, LEAD.replace("def solve(x):\n    return x * x\n", ""), "`"),
        (LEAD_PY, LEAD.replace("def solve(x):\n    return x * x\n", "# only a comment\n"), "`"),
        (LEAD_PY, LEAD.replace("it\n", "it\n\n"), "\n"),
        (LEAD_PY, LEAD.replace("it\n", "it\n    # indented\n"), "#"),
        (LEAD_C, LEAD_IN_C.replace("// why", "/* why */"), "*"),  # `/` might start `//`
        (LEAD_PY, LEAD.replace("```\n</variant 1>", "```\n```python\nx = 1\n```\n</variant 1>"), "x"),
        (LEAD_PY, LEAD.replace("square it", "unlike <variant 2>, square it"), "<"),
        (LEAD_PY, LEAD.replace("square it", "square `x`"), "`"),
        (LEAD_PY, LEAD.replace("it\n", "it\n# not ```x + 1```\n"), "`"),
        (LEAD_C, LEAD_IN_C.replace("// Change: one more", "// Change: one more \\"), "\\"),
    ],
    ids=["no-lead", "empty-lead", "no-space", "lower-case", "wrong-prefix", "wrong-prefix-c", "two-more-comments",
         "lead-only", "comments-only", "blank-after-lead", "indented-comment", "block-comment-c",
         "second-block-without-lead", "tag-in-lead", "backtick-in-lead", "fence-in-comment", "backslash-in-lead"],
)  # fmt: skip
def test_a_block_without_its_lead_comment_or_without_code_after_it_is_refused_where_it_goes_wrong(
    book, shape, text, where
):
    at = refused_at(book, shape, text)
    assert at is not None and at < len(text)
    assert text[at] == where, (at, text[:at])


def test_a_lead_comment_is_asked_in_the_full_format_only_and_with_a_known_prefix():
    with pytest.raises(ValueError):
        AnswerShape(1, "diff", "python", "#")
    with pytest.raises(ValueError):
        AnswerShape(1, "full", "python", "--")
    assert answer_gbnf(AnswerShape(1, "full", "python")) == answer_gbnf(AnswerShape(1, "full", "python", ""))
    assert "Change" not in answer_gbnf(AnswerShape(1, "full", "python"))


def test_a_program_of_several_files_is_held_to_headers_of_its_editable_files_and_parses_into_changed_children(book):
    """knapsack_files (two editable files under lib/, a fixed solver.py): a variant is one or more sections, each a
    header the prompt shows and that file's blocks or edits; a header of the fixed file, or of a file the program
    does not have, is refused where its name goes wrong; what is taken parses into changed children."""
    from evolve.group_sampler import answer_shape
    from evolve.options import RunOptions
    from evolve.problem import load_problem
    from evolve.prompts.tree_view import program_blocks
    from policies.answer_grammar import file_header

    seed = load_problem(Path(__file__).resolve().parents[1] / "problems" / "knapsack_files").seed_code
    options = RunOptions(variants=1, structured="on", lead_comment=False)
    full = answer_shape(options, "full", "python", seed, ("full", "diff"), multi_file=True)
    diff = answer_shape(options, "diff", "python", seed, ("full", "diff"), multi_file=True)
    assert full == AnswerShape(1, "full", "python", files=("lib/params.py", "lib/ranking.py"))
    # the header the grammar holds is the line the prompt shows (two layers, each its own f-string)
    shown = program_blocks(seed, "python").splitlines()
    assert all(file_header(path) in shown for path in full.files)
    assert diff is not None and diff.files == full.files
    rewrite = (
        "<variant 1>\n=== FILE: lib/params.py ===\n```python\ndef fill_fraction():\n    return 1.0\n```\n"
        "=== FILE: lib/ranking.py ===\n```python\ndef order(items):\n"
        "    return sorted(range(len(items)), key=lambda i: -items[i][0] / items[i][1])\n```\n</variant 1>"
    )
    edit = (
        "<variant 1>\n=== FILE: lib/params.py ===\n<<<<<<< SEARCH\n    return 0.6\n=======\n    return 0.95\n"
        ">>>>>>> REPLACE\n</variant 1>"
    )
    for shape, text in ((full, rewrite), (diff, edit)):
        assert refused_at(book, shape, text) is None
        assert [v.status for v in parse_completion(seed, text, 1, multi_file=True)] == ["ok"]
    fixed = rewrite.replace("lib/params.py", "solver.py")
    assert fixed[refused_at(book, full, fixed)] == "s"  # the fixed file: no header names it
    misnamed = rewrite.replace("lib/params.py", "lib/param.py")
    assert refused_at(book, full, misnamed) == len("<variant 1>\n=== FILE: lib/param")
    unnamed = rewrite.replace("=== FILE: lib/params.py ===\n", "")
    assert unnamed[refused_at(book, full, unnamed)] == "`"  # a section without its header
