"""The `vllm:` policy holds its answers to their shape: the answer's GBNF grammar goes in the request field the
server reads (`structured_outputs.grammar`, or `guided_grammar` on a vLLM before 0.10.2), found by a one-time
probe; a server that reads neither gets the plain prompt and the run's opening line says so.

Against a vLLM stand-in on loopback (tests/vllm_server.py): the taught tiny model's GGUF sampled by the project's
llama policy under the grammar the request carries, in the field that server reads, so a held answer is real
sampling under a real grammar engine, and an ignored field is real free text.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from evolve.cli.run_cmd import _structured_line
from evolve.prompts import completion_stop, parse_completion
from evolve.prompts.parser import split_variants
from policies.answer_grammar import AnswerShape, answer_gbnf
from policies.http_policy import HttpPolicy
from policies.policy import SamplingParams
from tests.conftest import tiny_pairs
from tests.helpers import SQUARE_SEED, evolve_run_cmd, write_square_problem
from tests.vllm_server import VllmStandIn

pytestmark = pytest.mark.slow
PROMPT = tiny_pairs()[0][0]  # a prompt the tiny model was taught on
SHAPE = AnswerShape(2, "full", "python")
PARAMS = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=400, seed=3, stop=completion_stop(2))
COMPLETIONS, PROBE_FIELDS = "/v1/completions", ("structured_outputs", "guided_grammar")


@pytest.fixture(scope="module")
def server(tiny_gguf):
    s = VllmStandIn(tiny_gguf).start()
    yield s
    s.stop()


def _policy(server: VllmStandIn, grammar_field: str) -> HttpPolicy:
    server.grammar_field = grammar_field
    server.bodies.clear()
    return HttpPolicy(server.url, server.model_name, flavor="vllm", max_wait_s=30)


def _fields(body: dict[str, Any]) -> set[str]:
    return set(body) & set(PROBE_FIELDS)


@pytest.mark.parametrize("grammar_field", PROBE_FIELDS, ids=["vllm-0.10.2-on", "vllm-before-0.10.2"])
def test_every_answer_keeps_to_its_shape_sent_in_the_field_the_server_reads(server, grammar_field):
    policy = _policy(server, grammar_field)
    assert policy.structured_formats == ("full", "diff")  # the probe, once, before any group
    probes = server.completions(COMPLETIONS)
    # the current field first; an older server ignores it (free text), and is asked with its own
    assert [_fields(b) for b in probes] == [{"structured_outputs"}] + ([{"guided_grammar"}] if probes[1:] else [])
    assert len(probes) == (1 if grammar_field == "structured_outputs" else 2)

    shaped = policy.generate(PROMPT, replace(PARAMS, structured=SHAPE), 3)
    sent = server.completions(COMPLETIONS)[-1]
    grammar = sent["structured_outputs"]["grammar"] if grammar_field == "structured_outputs" else sent[grammar_field]
    assert grammar == answer_gbnf(SHAPE) and _fields(sent) == {grammar_field}
    for g in shaped:
        assert g.finish_reason == "stop" and g.text.startswith("<variant 1>\n```python\n"), g.text
        assert g.text.endswith("</variant 2>") and len(split_variants(g.text, 2)) == 2, g.text
        assert all(v.status != "parse_error" for v in parse_completion(SQUARE_SEED, g.text, 2)), g.text
        # the stored path is unchanged: the sampled ids, one logprob each, decoding to the text
        assert g.token_ids and len(g.token_ids) == len(g.logprobs) and all(lp <= 0 for lp in g.logprobs)
        assert server.policy.tokenizer.decode(g.token_ids, skip_special_tokens=True) == g.text
    # Without the shape nothing is sent and nothing holds the answer. How often the taught model breaks the format
    # on its own depends on the CPU it was taught on (one taught on an AVX2-only EPYC wrote three well-formed
    # answers at 0.8), so the free answers are drawn at temperature 2 over the whole vocabulary: noise comes back.
    free = policy.generate(PROMPT, replace(PARAMS, temperature=2.0, top_p=1.0), 3)
    assert not _fields(server.completions(COMPLETIONS)[-1])
    assert any(v.status == "parse_error" for g in free for v in parse_completion(SQUARE_SEED, g.text, 2))
    assert _structured_line(_search_of(policy)) == (
        "structured sampling: auto: every answer is held to its tags and fences while it is sampled"
    )


@pytest.mark.parametrize("grammar_field", ["none", "refuses"], ids=["ignores-the-field", "refuses-the-field"])
def test_a_server_that_holds_no_grammar_gets_the_plain_prompt_and_the_opening_line_says_so(server, grammar_field):
    policy = _policy(server, grammar_field)
    assert policy.structured_formats == () and policy.takes_grammar is False
    assert policy.structured_formats == ()  # asked again: not probed again
    assert [_fields(b) for b in server.completions(COMPLETIONS)] == [{"structured_outputs"}, {"guided_grammar"}]
    said = "HTTP 400" if grammar_field == "refuses" else "outside a GBNF grammar"
    assert said in policy.grammar_note and all(f in policy.grammar_note for f in PROBE_FIELDS), policy.grammar_note
    group = policy.generate(PROMPT, replace(PARAMS, max_new_tokens=48, structured=SHAPE), 2)  # were it set
    assert len(group) == 2 and all(g.token_ids for g in group)
    assert not _fields(server.completions(COMPLETIONS)[-1])  # the plain prompt: no field sent
    assert _structured_line(_search_of(policy)) == (
        f"structured sampling: auto, but {policy.name} cannot (only llama.cpp and transformers policies, and "
        "servers that keep to a grammar, can): their answers are free text"
    )


def test_a_run_on_a_vllm_server_holds_its_answers_and_stores_their_token_ids(server, tmp_path):
    server.grammar_field = "structured_outputs"
    folder, db = write_square_problem(tmp_path / "sq"), tmp_path / "run.db"
    spec = f"vllm:{server.url}@{server.model_name}"
    command = evolve_run_cmd(folder, db, spec, 4, "--structured", "auto", "--workers", "1")
    out = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    line = "structured sampling: auto: every answer is held to its tags and fences"
    assert out.stdout.count(line) == 1, out.stdout
    rows = sqlite3.connect(db).execute("SELECT sampling, text, token_ids, logprobs FROM completions").fetchall()
    assert rows
    for sampling, text, ids, logprobs in rows:
        shape = json.loads(sampling)["structured"]
        assert shape is not None and ids and len(ids) == len(logprobs) > 0  # packed int32 / float32: 4 bytes each
        assert len(split_variants(text, shape["variants"])) == shape["variants"], text


def _search_of(policy: Any) -> Any:
    """What `_structured_line` reads of a search: its `--structured` and its members."""
    member = SimpleNamespace(name=policy.name, policy=policy)
    return SimpleNamespace(loop=SimpleNamespace(options=SimpleNamespace(structured="auto"), members=[member]))
