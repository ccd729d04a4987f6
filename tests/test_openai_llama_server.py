"""The `openai:` policy against a real OpenAI-compatible server: llama-cpp-python's own (`python -m
llama_cpp.server`, the `server` extra), serving the taught tiny model's GGUF, started and stopped here.

What that server does, and so what is checked exactly: it ignores `n` (one choice per request: the policy asks
n times, each with its own seed), cuts a stop string from the text while listing its tokens with their logprobs
(the policy puts it back), returns the model's raw logprobs (before temperature, top-k and the grammar) only when
`top_logprobs` is given, no token ids, and keeps to a GBNF `grammar` (the policy sends the answer's shape as one
after a one-time probe). The tiny tokenizer is byte-level: one token per byte of the text.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest

from evolve.cli.run_cmd import _structured_line
from evolve.prompts.builder import completion_stop
from evolve.prompts.parser import parse_completion, split_variants
from policies.answer_grammar import AnswerShape
from policies.from_spec import make_policy
from policies.http_policy import HttpPolicy
from policies.policy import SamplingParams, StructuredSampling
from tests.conftest import tiny_pairs
from tests.helpers import SQUARE_SEED, evolve_run_cmd, write_square_problem
from tests.llama_server import LlamaServer

pytestmark = pytest.mark.slow
PROMPT = tiny_pairs()[0][0]  # a prompt the tiny model was taught on (laid out here by the server's chat format)
PARAMS = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=48, seed=5)
# Where a test needs different seeds to give different texts: how sure the taught model is of the few tokens it
# writes on this prompt (the server's chat layout is not the one it was taught on) depends on the CPU it was taught
# on: one taught on an AVX2-only EPYC wrote the same 20 bytes for seeds 5, 6 and 7 at temperatures 0.8 to 2.0
# under top-k. At 2.0 over the whole vocabulary no seed writes what another does (bytes that are no text alone
# included, so the one-token-a-byte check stays with PARAMS).
HOT = replace(PARAMS, temperature=2.0, top_p=1.0)
SHAPE = AnswerShape(2, "full", "python")


@pytest.fixture(scope="module")
def server(tiny_gguf, tmp_path_factory):
    s = LlamaServer(tiny_gguf, tmp_path_factory.mktemp("llama-server") / "server.log").start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def policy(server):
    return make_policy(server.spec)


def _one_token_a_byte(group: list) -> None:
    for g in group:
        assert g.token_ids is None  # the chat API names tokens by their text only: never trained on
        assert g.logprobs is not None and len(g.logprobs) == len(g.text.encode())
        assert all(lp <= 0 for lp in g.logprobs)


def test_n_completions_come_back_with_their_text_and_logprobs(server, policy):
    assert policy.structured_formats  # the one-time probe, here rather than in the group's count
    before = server.requests()
    group = policy.generate(PROMPT, PARAMS, 3)
    assert len(group) == 3 and all(g.version == 0 and g.finish_reason in ("stop", "length") for g in group)
    _one_token_a_byte(group)
    assert policy.one_choice is True and server.requests(before + 3) == before + 3  # the server ignores n: 3 requests
    assert len({g.text for g in policy.generate(PROMPT, HOT, 3)}) == 3  # three seeds, three samples, not one thrice


def test_seeds_repeat_and_greedy_is_greedy(policy):
    first, again, other = (policy.generate(PROMPT, replace(HOT, seed=s), 2) for s in (5, 5, 6))
    assert [(g.text, g.logprobs) for g in first] == [(g.text, g.logprobs) for g in again]
    assert [g.text for g in first] != [g.text for g in other]
    greedy = [g.text for s in (1, 2) for g in policy.generate(PROMPT, replace(PARAMS, temperature=0.0, seed=s), 2)]
    assert len(set(greedy)) == 1
    # top-k 1 reaches the server (its own default is 40): at temperature 1 it samples the greedy text, and the
    # logprobs it reports are the model's raw ones, not those of the distribution drawn from (all 0 under top-k 1)
    top1 = policy.generate(PROMPT, replace(PARAMS, temperature=1.0, top_k=1), 2)
    raw = policy.generate(PROMPT, replace(PARAMS, temperature=0.0), 1)[0].logprobs
    assert [g.text for g in top1] == greedy[:2] and all(g.logprobs == raw for g in top1)
    assert raw is not None and min(raw) < -0.01


def test_a_stop_string_ends_the_text_and_stays_in_it(policy):
    group = policy.generate(PROMPT, replace(PARAMS, max_new_tokens=120, stop=("```",)), 3)
    for g in group:
        assert g.finish_reason == "stop" and g.text.endswith("```") and g.text.count("```") == 1, g.text
    _one_token_a_byte(group)  # the logprobs cover the stop string's tokens too: text and logprobs agree


def test_the_answer_shape_is_sent_as_a_grammar_and_kept(policy):
    assert isinstance(policy, StructuredSampling) and policy.structured_formats == ("full", "diff")
    plain = replace(PARAMS, max_new_tokens=400, stop=completion_stop(2), seed=11)
    shaped = policy.generate(PROMPT, replace(plain, structured=SHAPE), 3)
    for g in shaped:
        assert g.finish_reason == "stop" and g.text.startswith("<variant 1>\n```python\n"), g.text
        assert g.text.endswith("</variant 2>") and len(split_variants(g.text, 2)) == 2, g.text
        assert all(v.status != "parse_error" for v in parse_completion(SQUARE_SEED, g.text, 2)), g.text
    _one_token_a_byte(shaped)
    free = policy.generate(PROMPT, plain, 3)  # the same seeds without the grammar: noise, as the model writes it
    for g in free:
        assert any(v.status == "parse_error" for v in parse_completion(SQUARE_SEED, g.text, 2)), g.text
    line = _structured_line(_search_of(policy))
    assert line == "structured sampling: auto: every answer is held to its tags and fences while it is sampled"


def test_a_run_holds_its_answers_to_their_shape_over_http(server, tmp_path):
    folder, db = write_square_problem(tmp_path / "sq"), tmp_path / "run.db"
    command = evolve_run_cmd(folder, db, server.spec, 4, "--structured", "auto", "--workers", "1")
    out = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "structured sampling: auto: every answer is held to its tags and fences" in out.stdout, out.stdout
    con = sqlite3.connect(db)
    rows = con.execute("SELECT sampling, text, token_ids FROM completions").fetchall()
    assert rows and all(json.loads(s)["structured"] is not None and ids is None for s, _t, ids in rows)
    assert all(len(split_variants(t, json.loads(s)["structured"]["variants"])) >= 1 for s, t, _ids in rows)


# ---- a server without grammars: the plain prompt, said once at the start ------------------------------------
class _Plain(BaseHTTPRequestHandler):
    """An OpenAI-like server that answers every chat request "Hello" (n choices), or refuses a `grammar` field
    with a 400 as the OpenAI API refuses an unknown argument; it keeps the bodies it was sent."""

    refuse_grammar = False
    bodies: ClassVar[list[dict[str, Any]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.bodies.append(body)
        if self.refuse_grammar and "grammar" in body:
            code, out = 400, {"error": {"message": "Unrecognized request argument supplied: grammar"}}
        else:
            choice = {"message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}
            code, out = 200, {"choices": [{**choice, "index": i} for i in range(body.get("n", 1))]}
        data = json.dumps(out).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.mark.parametrize("refuse", [False, True], ids=["ignores-grammar", "refuses-grammar"])
def test_a_server_without_grammars_gets_the_plain_prompt(refuse):
    handler = type("Handler", (_Plain,), {"refuse_grammar": refuse, "bodies": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        policy = HttpPolicy(f"http://127.0.0.1:{httpd.server_port}", "m", flavor="openai", max_wait_s=10)
        assert policy.structured_formats == () and policy.takes_grammar is False
        assert ("HTTP 400" if refuse else "answered ['Hello'] outside a GBNF grammar") in policy.grammar_note
        group = policy.generate("x", replace(PARAMS, structured=SHAPE), 2)  # were it set, it is not sent
        assert [g.text for g in group] == ["Hello", "Hello"] and policy.one_choice is not True
        sent = handler.bodies[-1]
        assert sent["n"] == 2 and not {"grammar", "top_k", "min_p", "repeat_penalty"} & set(sent)
        assert _structured_line(_search_of(policy)) == (
            f"structured sampling: auto, but {policy.name} cannot (only llama.cpp and transformers policies, and "
            "servers that keep to a grammar, can): their answers are free text"
        )
    finally:
        httpd.shutdown()
        httpd.server_close()


def _search_of(policy: Any) -> Any:
    """What `_structured_line` reads of a search: its `--structured` and its members."""
    member = SimpleNamespace(name=policy.name, policy=policy)
    return SimpleNamespace(loop=SimpleNamespace(options=SimpleNamespace(structured="auto"), members=[member]))
