"""The answer's grammar as vLLM's structured-outputs backends read it: answer_gbnf writes llama.cpp's GBNF, and
the `vllm:` policy sends it unconverted (policies/http_grammar.py), so xgrammar (vLLM's default backend, which
reads it as EBNF) and llguidance (the `guidance` backend, which converts GBNF itself) must take exactly the texts
llama.cpp takes (tests/test_answer_grammar.py) and refuse the same ones.

Each backend judges token by token over the tiny byte-level tokenizer (one token a character), as vLLM's
matchers judge sampled tokens, and an answer is taken whole when the end-of-sequence token may follow it.
xgrammar and llguidance come with vLLM (the `vllm` extra), not with this project's setup: a machine without them
skips these tests.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from evolve.prompts import parse_completion
from policies.answer_grammar import AnswerShape, answer_gbnf
from policies.tiny import tiny_tokenizer
from tests.helpers import SQUARE_SEED
from tests.test_answer_grammar import DIFF, FULL, LEAD, LEAD_C, LEAD_IN_C, LEAD_PY

Taker = Callable[[AnswerShape, str], bool]
FIRST = FULL.split("\n\n<variant 2>")[0]
TAKEN = [
    (AnswerShape(2, "full", "python"), FULL),
    (AnswerShape(1, "diff"), DIFF),
    (AnswerShape(1, "full", ""), FIRST.replace("```python", "```")),
    (AnswerShape(1, "full", "c"), "<variant 1>\n```c\nint a;\n```\n```c\nint b;\n```\n</variant 1>"),
    (AnswerShape(2, "full", "python"), FULL.replace("```\n</variant 1>", "    ```\n</variant 1>")),
    (AnswerShape(1, "diff", "python"), FIRST),
    (AnswerShape(1, "diff"), DIFF.replace("    return x * x\n", "    >>> solve(3)\n    return x * x\n")),
    # the character classes' escapes: a backslash, brackets, a caret, a dash and a tab in code; a c# fence
    (AnswerShape(1, "full", "python"), "<variant 1>\n```python\nx = '\\\\] ^ - [' \t# tab\n\n```\n</variant 1>"),
    (AnswerShape(1, "full", "c#"), "<variant 1>\n```c#\nint a; // b\n```\n</variant 1>"),
    # a lead comment first in each block, one more comment line, then code
    (LEAD_PY, LEAD),
    (LEAD_C, LEAD_IN_C),
]
REFUSED = [
    (AnswerShape(2, "full", "python"), "### Variant 1\n" + FULL),  # a prose heading
    (AnswerShape(2, "full", "python"), FULL.replace("<variant 1>\n", "<variant 1>\nSquare it.\n")),  # a line of idea
    (AnswerShape(2, "full", "python"), FULL.replace("```python", "```py\n")),  # the wrong fence
    (AnswerShape(2, "full", "python"), FULL.replace("```\n</variant 1>", "</variant 1>\n```")),  # tag inside fence
    (AnswerShape(2, "full", "python"), FULL.replace("</variant 1>\n\n", "</variant 1>\n\n\n")),  # blank lines
    (AnswerShape(1, "diff"), DIFF.replace("=======\n", "")),  # an edit without its divider
    (AnswerShape(1, "diff"), DIFF.replace("=======\n", "    >>>>> REPLACE\n")),  # an indented marker
    (AnswerShape(2, "full", "python"), FIRST),  # a variant missing
    (AnswerShape(2, "full", "python"), FULL + "\n"),  # anything after the last tag
    (LEAD_PY, LEAD.replace("# Change: square it\n", "")),  # a block without its lead comment
    (LEAD_PY, LEAD.replace("it\n", "it\n# one\n# two\n")),  # two more comment lines
    (LEAD_C, LEAD_IN_C.replace("int f(int x) { return x + 2; }\n", "")),  # comments only
]


def _xgrammar() -> Taker:
    xgr = pytest.importorskip("xgrammar", reason="xgrammar comes with vLLM (pip install 'vpo-evolve[vllm]')")
    tokenizer = tiny_tokenizer()
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer))

    def takes(shape: AnswerShape, text: str) -> bool:
        gbnf = answer_gbnf(shape)
        assert "::=" in gbnf.splitlines()[0]  # vLLM reads a grammar with a `::=` rule as EBNF, not Lark
        matcher = xgr.GrammarMatcher(compiler.compile_grammar(gbnf))
        ids = tokenizer(text, add_special_tokens=False).input_ids
        return all(matcher.accept_token(i) for i in ids) and matcher.accept_token(tokenizer.eos_token_id)

    return takes


def _llguidance() -> Taker:
    llg = pytest.importorskip("llguidance", reason="llguidance comes with vLLM (pip install 'vpo-evolve[vllm]')")
    import llguidance.hf

    tokenizer = tiny_tokenizer()
    vocab = llguidance.hf.from_tokenizer(tokenizer)

    def takes(shape: AnswerShape, text: str) -> bool:
        grammar = llg.grammar_from("grammar", answer_gbnf(shape))  # as vLLM's guidance backend serialises it
        assert not llg.LLMatcher.validate_grammar(grammar, vocab)  # no error
        matcher = llg.LLMatcher(vocab, grammar, log_level=0)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        return matcher.consume_tokens(ids) and not matcher.is_error() and matcher.is_accepting()

    return takes


@pytest.fixture(params=["xgrammar", "llguidance"])
def takes(request) -> Taker:
    return {"xgrammar": _xgrammar, "llguidance": _llguidance}[request.param]()


def test_the_answers_llama_cpp_takes_are_taken_whole(takes):
    for shape, text in TAKEN:
        assert takes(shape, text), text
    assert [v.status for v in parse_completion(SQUARE_SEED, FULL, 2)] == ["ok", "ok"]


def test_the_shapes_llama_cpp_refuses_are_refused(takes):
    for shape, text in REFUSED:
        assert not takes(shape, text), text
