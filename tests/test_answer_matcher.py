"""The pure-Python matcher of the answer's language (policies/answer_matcher.py) takes exactly what llama.cpp's
grammar engine takes under `answer_gbnf(shape)`: both are driven character by character over generated answers
and near-misses (a fence line inside code, a closing tag at a line start inside code, indented markers, missing
newlines, a variant too many, text after the last tag; with a lead comment asked, a block without it, with its text
empty or its prefix wrong, with two more comment lines, or with comments only), and give the same verdict at
every character (may it come next, may the answer end here); cut into chunks of several characters (tokens
spanning lines and tags), the matcher takes a chunk exactly when llama.cpp takes each of its characters.

llama.cpp judges token ids of a llama vocab: the tiny model's GGUF, whose tokens are single bytes, so a string
is fed to it one byte at a time (a character of two bytes is taken when both are)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from policies.answer_grammar import AnswerShape, answer_gbnf
from policies.answer_matcher import AnswerMatcher
from policies.held_rows import HeldVocab, VocabTexts
from tests.helpers import need_llama
from tests.test_answer_grammar import DIFF, FULL, LEAD, LEAD_C, LEAD_IN_C, LEAD_PY

Trace = list[tuple[bool, bool]]  # per character of a string, until the first refused: (taken, may end before it)


@pytest.fixture(scope="module")
def llama_engine(tiny_gguf):
    need_llama()
    from transformers import AutoTokenizer

    from policies.llama_grammar import GrammarBook
    from policies.llama_runtime import llama_module

    lib = llama_module()
    model = lib.llama_model_load_from_file(str(tiny_gguf).encode(), lib.llama_model_default_params())
    vocab = lib.llama_model_get_vocab(model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_gguf.parent)
    grammars = GrammarBook(lib, vocab, lib.llama_vocab_n_tokens(vocab), {tokenizer.eos_token_id})
    yield grammars, tokenizer
    grammars.close()
    lib.llama_model_free(model)


def llama_trace(engine, shape: AnswerShape, text: str) -> Trace:
    """llama.cpp's verdicts on `text` under the grammar of `shape`, plus one for the end of turn after it."""
    grammars, tokenizer = engine
    eos = tokenizer.eos_token_id
    row = grammars.row(answer_gbnf(shape))
    trace: Trace = []
    try:
        for char in text:
            ids = tokenizer(char, add_special_tokens=False).input_ids
            taken = True
            for at, token in enumerate(ids):
                ok = row.allowed(np.array([token, eos]))
                if at == 0:
                    trace.append((bool(ok[0]), bool(ok[1])))
                taken = taken and bool(ok[0])
                if not taken:
                    break
                row.accept(token)
            trace[-1] = (taken, trace[-1][1])
            if not taken:
                return trace
        trace.append((False, bool(row.allowed(np.array([eos]))[0])))
        return trace
    finally:
        row.close()


def matcher_trace(shape: AnswerShape, text: str) -> Trace:
    matcher = AnswerMatcher(shape)
    state = matcher.start()
    trace: Trace = []
    for char in text:
        after = matcher.advance(state, char)
        trace.append((after is not None, matcher.complete(state)))
        if after is None:
            return trace
        state = after
    trace.append((False, matcher.complete(state)))
    return trace


def check_chunks(shape: AnswerShape, text: str, taken: int, cuts: list[int]) -> None:
    """From every cut, the next chunk is taken whole exactly when each of its characters is (`taken`: how many
    characters of `text` are, from its start)."""
    matcher = AnswerMatcher(shape)
    state = matcher.start()
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    for start, end in pairwise(bounds):
        if start > taken:
            return
        after = matcher.advance(state, text[start:end])
        assert (after is not None) == (end <= taken), (text[:start], text[start:end])
        if after is None:
            return
        state = after


def assert_same(engine, shape: AnswerShape, text: str, cuts: list[int] = ()) -> Trace:
    expected = llama_trace(engine, shape, text)
    assert matcher_trace(shape, text) == expected, (shape, text)
    check_chunks(shape, text, len(expected) - 1, list(cuts))  # the last entry is the first refused, or the end
    return expected


# ---- near-misses, named ---------------------------------------------------------------------------------------
FULL2, FULL3 = AnswerShape(2, "full", "python"), AnswerShape(3, "full", "python")
DIFF1 = AnswerShape(1, "diff")
FIRST = FULL.split("\n\n<variant 2>")[0]
TREE_FULL = AnswerShape(1, "full", "python", files=("lib/a.py", "b.py"))
TREE_DIFF = AnswerShape(1, "diff", files=("b.py",))
TREE = "<variant 1>\n=== FILE: lib/a.py ===\n```python\nx = 1\n```\n=== FILE: b.py ===\n```python\ny\n```\n</variant 1>"
TREE_EDITS = (
    "<variant 1>\n=== FILE: b.py ===\n<<<<<<< SEARCH\na\n=======\nb\n>>>>>>> REPLACE\n=== FILE: b.py ===\n"
    "<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n</variant 1>"
)
NEAR_MISSES = [
    (FULL2, FULL),
    (FULL2, FULL.replace("    return x * x\n", "    return x * x\n```python\n")),  # a fence's opening inside code
    (FULL2, FULL.replace("    return x * x\n", "</variant 1>\n")),  # a closing tag at a line start inside code
    (FULL2, FULL.replace("    return x * x\n", "  </variant 1>\n")),  # ...indented
    (FULL2, FULL.replace("    return x * x\n", "    <variant 2>\n")),
    (FULL2, FULL.replace("    return x * x\n", "    return x < y </b>\n")),  # a tag inside a line: code
    (FULL2, FULL.replace("```\n</variant 1>", "\t  ```\n</variant 1>")),  # an indented fence close
    (FULL2, FULL.replace("```\n</variant 1>", "```</variant 1>")),  # a missing newline
    (FULL2, FULL.replace("<variant 1>\n", "<variant 1>")),
    (FULL2, FULL.replace("</variant 1>\n\n", "</variant 1>")),
    (FULL2, FULL.replace("</variant 1>\n\n", "</variant 1>\n")),
    (FULL2, FULL + "\n"),  # text after the last tag
    (FULL2, FULL + " "),
    (FULL2, FULL + "\n\n<variant 3>\n```python\nx\n```\n</variant 3>"),  # a variant too many
    (FULL3, FULL + "\n<variant 3>\n```python\nx\n```\n</variant 3>"),
    (FULL3, FULL + "\n\n\n<variant 3>"),
    (AnswerShape(2, "full", "c"), FULL),  # the wrong fence tag
    (AnswerShape(2, "full"), FULL.replace("```python", "```")),
    (DIFF1, DIFF),
    (DIFF1, DIFF.replace("=======", "  =======")),  # an indented divider
    (DIFF1, DIFF.replace("=======", "======")),
    (DIFF1, DIFF.replace("=======", "========")),
    (DIFF1, DIFF.replace(">>>>>>> REPLACE", "    >>>>>>> REPLACE")),
    (DIFF1, DIFF.replace(">>>>>>> REPLACE", ">>>>>>> REPLACE ")),
    (DIFF1, DIFF.replace("<<<<<<< SEARCH", " <<<<<<< SEARCH")),  # an indented SEARCH is not one
    (DIFF1, DIFF.replace("    return x * x\n", "    <<<<<<< SEARCH\n")),  # a marker inside an edit
    (DIFF1, DIFF.replace("    return x * x\n", "    ====\n    <<<<\n    >>>> x\n")),  # short runs are code
    (DIFF1, DIFF.replace("</variant 1>", DIFF.split("\n", 1)[1])),  # two edits
    (DIFF1, DIFF.replace("</variant 1>", "```\nx\n```\n</variant 1>")),  # an edit then a fence: not both
    (AnswerShape(1, "diff", "python"), FIRST),  # fenced code under diff
    (AnswerShape(1, "full", "python"), DIFF),  # an edit under full
    (AnswerShape(2, "full", "python"), FULL.replace("# `x`", "é → ü `x`")),  # characters of several bytes
    (AnswerShape(11, "full"), "".join(f"<variant {k}>\n```\nx\n```\n</variant {k}>\n" for k in range(1, 12))[:-1]),
    # a lead comment asked (`# Change: ...` first in each fenced block), and its near-misses
    (LEAD_PY, LEAD),
    (LEAD_PY, LEAD.replace("it\n", "it\n# one more\n")),
    (LEAD_C, LEAD_IN_C),
    (LEAD_C, LEAD_IN_C.replace("// why\n", "")),
    (LEAD_C, LEAD_IN_C.replace("// why", "//")),  # a comment line of its prefix alone
    (LEAD_PY, LEAD.replace("# Change: square it\n", "")),  # the lead missing
    (LEAD_PY, LEAD.replace("square it", "")),  # its text empty
    (LEAD_PY, LEAD.replace("# Change: square it", "# Change:  ")),  # ...or a space
    (LEAD_PY, LEAD.replace("# Change: ", "# Change:")),
    (LEAD_PY, LEAD.replace("# Change: ", "// Change: ")),  # the wrong prefix
    (LEAD_C, LEAD_IN_C.replace("// Change: ", "# Change: ")),
    (LEAD_C, LEAD_IN_C.replace("// Change: ", "/ Change: ")),
    (LEAD_PY, LEAD.replace("it\n", "it\n# one\n# two\n")),  # two more comment lines
    (LEAD_PY, LEAD.replace("def solve(x):\n    return x * x\n", "")),  # the lead alone
    (LEAD_PY, LEAD.replace("def solve(x):\n    return x * x\n", "# only a comment\n")),  # comments only
    (LEAD_C, LEAD_IN_C.replace("// why", "/* why */")),  # a line of code may not start with the prefix's `/`
    (LEAD_C, LEAD_IN_C.replace("// why", "/")),
    (LEAD_PY, LEAD.replace("it\n", "it\n\n")),  # a blank line, or one of spaces, is no code
    (LEAD_PY, LEAD.replace("it\n", "it\n  \t\n")),
    (LEAD_PY, LEAD.replace("it\n", "it\n    # indented\n")),  # an indented comment
    (LEAD_PY, LEAD.replace("def solve(x):", "```")),  # the fence closed after the lead
    (LEAD_PY, LEAD.replace("def solve(x):", "  </variant 1>")),
    (LEAD_PY, LEAD.replace("def solve(x):", "  =======")),
    (LEAD_PY, LEAD.replace("def solve(x):", "<b> = 1")),  # a `<` that starts no tag: code
    (LEAD_PY, LEAD.replace("square it", "é → ü")),  # the lead's text is free but for COMMENT_NEVER
    (LEAD_PY, LEAD.replace("square it", "é → ü ```")),
    (LEAD_PY, LEAD.replace("square it", "unlike <variant 2>")),
    (LEAD_C, LEAD_IN_C.replace("// why", "// why \\")),  # C goes on with a comment after a backslash
    (LEAD_PY, LEAD.replace("```\n</variant 1>", "```\n```python\nx = 1\n```\n</variant 1>")),  # 2nd block: no lead
    (LEAD_PY, FULL.split("\n\n<variant 2>")[0]),
    (AnswerShape(1, "full", "python"), LEAD),  # no lead asked: it is a code line
    # a program of several files: each variant one or more sections, a file's header and its blocks or edits
    (TREE_FULL, TREE),
    (TREE_FULL, TREE.replace("=== FILE: b.py ===\n", "")),  # one section
    (TREE_FULL, TREE.replace("<variant 1>\n=== FILE: lib/a.py ===\n", "<variant 1>\n")),  # no header first
    (TREE_FULL, TREE.replace("lib/a.py", "c.py")),  # a file it may not change
    (TREE_FULL, TREE.replace("=== FILE: b.py ===", "=== FILE: b.py ==")),
    (TREE_FULL, TREE.replace("=== FILE: b.py ===", "### FILE: b.py")),
    (TREE_FULL, TREE.replace("```\n=== FILE: b.py ===\n", "=== FILE: b.py ===\n")),  # a header inside a fence
    (TREE_FULL, TREE.replace("=== FILE: b.py ===\n```", "=== FILE: b.py ===\n\n```")),
    (TREE_FULL, TREE.replace("```\n</variant 1>", "```\n=== FILE: b.py ===\n</variant 1>")),  # a header alone
    (TREE_DIFF, TREE_EDITS),
    (TREE_DIFF, TREE_EDITS.replace(">>>>>>> REPLACE\n=== FILE: b.py ===\n", ">>>>>>> REPLACE\n")),  # 2 edits, 1 file
    (TREE_DIFF, TREE_EDITS.replace("<<<<<<< SEARCH\nx\n=======\ny\n>>>>>>> REPLACE\n</", "```\nz\n```\n</")),
    (AnswerShape(1, "diff"), TREE_EDITS),  # headers under a shape of one file
]


@pytest.mark.parametrize(("shape", "text"), NEAR_MISSES)
def test_the_matcher_and_llama_cpp_agree_on_named_near_misses(llama_engine, shape, text):
    assert_same(llama_engine, shape, text, cuts=list(range(0, len(text), 7)))


def test_the_named_answers_are_taken_whole_and_may_end_and_their_near_misses_not():
    """The matcher's own verdicts on a few of the cases above, so a wrong shared assumption is seen too."""
    matcher = AnswerMatcher(FULL2)
    done = matcher.advance(matcher.start(), FULL)
    assert done is not None and matcher.complete(done)
    assert matcher.advance(done, "\n") is None and matcher.advance(matcher.start(), FULL[:-1]) is not None
    assert not matcher.complete(matcher.advance(matcher.start(), FULL[:-1]))
    assert matcher.advance(matcher.start(), NEAR_MISSES[1][1]) is None
    assert matcher.advance(matcher.start(), NEAR_MISSES[5][1]) is not None


# ---- generated answers and their mutations ------------------------------------------------------------------
TRICKY = ["```", "```python", "```c", "  ```", "\t```", "``` ", "``", "`x`", "</variant 1>", "</variant 2>",
          "<variant 2>", "<variant 3>", " </variant 1>", "<<<<<<< SEARCH", "=======", "  =======", ">>>>>>> REPLACE",
          "\t>>>>>>> REPLACE", "<<<<", "<<<<<", "====", "=====", ">>>>", ">>>>>", "<b>", "<", "</", "<v", "<vari",
          "<variant", "<variantx", "", " ", "\t", "    return x", "x = 1 # é", "# Change: x", "// Change: x",
          "#", "//", "/", "/* c */", "  # c", "# Change:", "// Change: ", "=== FILE: lib/a.py ===",
          "=== FILE: c.py ===", "=== FILE: b.py ==", "===", "=== FILE: "]  # fmt: skip
FILES = ("lib/a.py", "b.py")  # a program of several files: the editable ones a header may name
PLAIN = st.text(alphabet="ab1 \t=<>/`é#", max_size=10).map(lambda s: s.replace("\n", ""))
LINE = st.one_of(PLAIN, PLAIN, PLAIN, st.sampled_from(TRICKY))


@st.composite
def answers(draw: st.DrawFn) -> tuple[AnswerShape, str]:
    m, edit_format = draw(st.integers(1, 3)), draw(st.sampled_from(["full", "diff"]))
    lead = draw(st.sampled_from(["", "", "#", "//"])) if edit_format == "full" else ""
    files = draw(st.sampled_from([(), (), FILES]))
    shape = AnswerShape(m, edit_format, draw(st.sampled_from(["", "python", "c"])), lead, files)
    code = st.lists(LINE, max_size=3).map(lambda lines: "".join(line + "\n" for line in lines))
    head = st.just("")
    if lead:  # the lead line (its text sometimes empty), comment lines (two sometimes), code (mostly)
        text = st.one_of(st.just("x"), PLAIN)
        comments = st.lists(text.map(lambda t: f"{lead}{t}\n"), max_size=draw(st.sampled_from([1, 1, 2])))
        first = st.sampled_from(["x = 1\n", "  y\n", "<b>\n", ""])
        head = st.tuples(text.map(lambda t: f"{lead} Change: {t}\n"), comments.map("".join), first).map("".join)
    fence = st.tuples(head, code).map(lambda hc: f"```{shape.language}\n{hc[0]}{hc[1]}```\n")
    edit = st.tuples(code, code).map(lambda sr: f"<<<<<<< SEARCH\n{sr[0]}=======\n{sr[1]}>>>>>>> REPLACE\n")
    parts = []
    for k in range(1, m + 1 + draw(st.integers(0, 1))):  # sometimes a variant too many
        body = ""
        for path in draw(st.lists(st.sampled_from([*FILES, "c.py"]), min_size=1, max_size=2)) if files else [""]:
            blocks = edit if shape.edit_format == "diff" and draw(st.booleans()) else fence
            header = f"=== FILE: {path} ===\n" if path else ""
            body += header + "".join(draw(st.lists(blocks, min_size=1, max_size=2)))
        parts.append(f"<variant {k}>\n{body}</variant {k}>")
    text = "".join(p + draw(st.sampled_from(["\n", "\n\n", "\n\n", "", "\n\n\n"])) for p in parts[:-1]) + parts[-1]
    if draw(st.booleans()):  # a near-miss: one edit at one place, or text after the end
        at = draw(st.integers(0, len(text)))
        cut = draw(st.integers(0, 3))
        text = text[:at] + draw(st.one_of(PLAIN, st.sampled_from(["\n", " ", "`", "<", "=", ">"]))) + text[at + cut :]
    other, n = draw(st.integers(0, 5)), draw(st.integers(1, 3))  # sometimes judged as another shape's answer
    checked = shape if other > 1 else AnswerShape(n, "diff", shape.language, files=draw(st.sampled_from([(), FILES])))
    if other == 1:
        checked = AnswerShape(n, "full", shape.language, draw(st.sampled_from(["", "#", "//"])), FILES[: n % 2 * 2])
    return checked, text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers(), st.lists(st.integers(0, 400), max_size=12))
def test_the_matcher_and_llama_cpp_agree_on_generated_answers_at_every_character(llama_engine, answer, cuts):
    shape, text = answer
    assert_same(llama_engine, shape, text, cuts)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answers(), st.lists(st.integers(0, 400), max_size=30), st.lists(st.sampled_from(TRICKY), max_size=8))
def test_a_whole_vocabulary_mask_judges_every_token_as_its_text_alone_would(answer, cuts, extra):
    """`HeldVocab.full_mask` walks the vocabulary in groups of shared first characters; it must agree with
    judging each token's text alone, for tokens that span lines and tags (pieces of the answer itself)."""
    shape, text = answer
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    pieces = [text[a:b] for a, b in pairwise(bounds)]
    extra_pieces = [piece for p in extra for piece in (p + "\n", "\n" + p, "x\n" + p, "é\n" + p, "  \n" + p)]
    extra_pieces += ["\n\n", " " * 8, "é\n```", "", "\t=="]
    texts: list[str | None] = [*sorted({*pieces, *extra_pieces}), None]
    eos = len(texts)
    held = HeldVocab(shape, VocabTexts.of_texts([*texts, None], [eos]))
    matcher, row = held.matcher, held.row()
    for piece in [*pieces, None]:
        direct = [t is not None and t != "" and matcher.advance(row.state, t) is not None for t in texts]
        assert held.full_mask(row.state).tolist() == [*direct, matcher.complete(row.state)]
        if piece is None or matcher.advance(row.state, piece) is None:
            return
        row.accept(texts.index(piece))


def test_a_lead_comment_s_text_holds_no_backtick_tag_or_backslash():
    """The parser reads a fence or a tag in the middle of a line, and C a comment on over a trailing backslash."""
    matcher = AnswerMatcher(LEAD_PY)
    done = matcher.advance(matcher.start(), LEAD)
    assert done is not None and matcher.complete(done)
    for bad in ("```", "<variant 2>", "`x`", "\\"):
        assert matcher.advance(matcher.start(), LEAD.replace("square it", f"square it {bad}")) is None, bad
        assert matcher.advance(matcher.start(), LEAD.replace("it\n", f"it\n# {bad}\n")) is None, bad
