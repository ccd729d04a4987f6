"""How an HTTP server is asked to hold a completion to a GBNF grammar, and how to tell that it did.

Why per flavor: no OpenAI-compatible API names a grammar field, so each server kind reads its own, and one that
does not know a field mostly ignores it (answers free text) rather than refusing it. So the field is chosen by
asking once (`HttpPolicy._probe`): a tiny request under `PROBE_GRAMMAR`, whose answer keeps to it only where the
server read the field; the fields of the policy's flavor are tried in order, and the first one kept is sent with
every group's answer shape (policies/answer_grammar.py). What a field refused (a 4xx) or ignored is kept for the
policy's `grammar_note`.

- `openai` (llama.cpp's `llama-server`, llama-cpp-python's server): llama.cpp's top-level `grammar` (GBNF).
- `vllm`: `structured_outputs: {"grammar": ...}` first: vLLM 0.10.2 introduced it (with `StructuredOutputsParams`
  in process), and from 0.12.0 it is the only one (docs.vllm.ai, Structured Outputs: the `guided_*` fields
  "were removed in v0.12.0"). Then the older `guided_grammar`, which vLLM before 0.10.2 reads (0.10.2 to 0.11.x
  read both). A vLLM reading neither logs the field as ignored (its request models allow extra fields) and
  answers free text, so the probe tells the versions apart by their answers, not by a version number. A vLLM
  whose structured-outputs backend takes no grammar (`outlines`) refuses the field with a 400: no grammar.

The grammar is sent as answer_gbnf writes it, unconverted. vLLM's default backend, xgrammar, reads it as EBNF
(vLLM passes a grammar with a `::=` rule to xgrammar's EBNF reader, one without as Lark), and xgrammar's EBNF is
llama.cpp's GBNF in everything answer_gbnf writes: `::=` rules named with letters, digits and `-`, string
literals with `\\n`, `\\t`, `\\\\` and `\\"` escapes, character classes with `^` and escaped `]`, `^`, `-` and
`\\`, `?`, `*`, `+` and parentheses; the `guidance` backend's llguidance converts GBNF itself.
tests/test_grammar_dialects.py checks that both take the same texts llama.cpp takes and refuse the same ones.
That is vLLM's V1 engine; the V0 engine (gone in 0.11) took any grammar with a `|` in a line for Lark and
converted it, which would garble this one: not supported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
# What the server is asked once, and the grammar its answer must keep to (no model answers "qqqq" unasked). At
# temperature 1, every sampler's plain case: the grammar alone decides the letters, and a greedy request is one
# some samplers refuse (transformers' warpers raise at temperature 0: the tests' loopback server dropped the
# connection, and the probe waited out `max_wait_s`).
PROBE_MESSAGES = [{"role": "user", "content": "Say hello."}]
PROBE_GRAMMAR = 'root ::= "q"+'
PROBE_SAMPLING = {"n": 2, "max_tokens": 4, "temperature": 1.0}


@dataclass(frozen=True)
class GrammarField:
    """A request field that carries a GBNF grammar, as a dotted path (`structured_outputs.grammar`)."""

    name: str

    def payload(self, gbnf: str) -> dict[str, Any]:
        """The request fields that carry `gbnf`, to merge into a request body."""
        value: Any = gbnf
        for key in reversed(self.name.split(".")):
            value = {key: value}
        return value


LLAMA_CPP = GrammarField("grammar")
VLLM = GrammarField("structured_outputs.grammar")
VLLM_BEFORE_0_10_2 = GrammarField("guided_grammar")
FIELDS = {"openai": (LLAMA_CPP,), "vllm": (VLLM, VLLM_BEFORE_0_10_2)}


def probe_request(flavor: str, model: str, field: GrammarField) -> tuple[str, dict[str, Any]]:
    """The path and body of the probe with its grammar in `field`: a chat request for the openai flavor (its
    answer also says whether the server honours `n`), a completion from a text prompt for vLLM."""
    if flavor == "openai":
        return CHAT, {"model": model, "messages": PROBE_MESSAGES, **PROBE_SAMPLING, **field.payload(PROBE_GRAMMAR)}
    prompt = PROBE_MESSAGES[0]["content"]
    return COMPLETIONS, {"model": model, "prompt": prompt, **PROBE_SAMPLING, **field.payload(PROBE_GRAMMAR)}


def probe_texts(body: Any) -> list[str]:
    """The texts of the probe's answer: each choice's `text` (completions) or message content (chat)."""
    choices = body.get("choices") if isinstance(body, dict) else None
    texts = []
    for choice in choices if isinstance(choices, list) else []:
        if isinstance(choice, dict):
            text = choice["text"] if "text" in choice else (choice.get("message") or {}).get("content")
            texts.append(str(text or ""))
    return texts


def kept_to_probe(texts: list[str]) -> bool:
    """Whether every answer keeps to `PROBE_GRAMMAR` (and there is one)."""
    return bool(texts) and all(t and set(t) == {"q"} for t in texts)
