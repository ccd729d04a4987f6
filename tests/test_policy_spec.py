"""A policy spec is parsed once (policies/spec.py): its parts, its text again, one-line refusals, anchoring."""

from __future__ import annotations

import pytest

from policies.policy import PolicyError
from policies.spec import PolicySpec


@pytest.mark.parametrize(
    ("text", "backend", "urls", "model"),
    [
        ("embedded", "embedded", (), None),
        ("llama:embedded", "llama", (), None),
        ("vllm:http://a:8000", "vllm", ("http://a:8000",), None),
        ("vllm:http://a:8000, http://b:8000@Qwen/Q", "vllm", ("http://a:8000", "http://b:8000"), "Qwen/Q"),
        ("openai:https://h/v1@m", "openai", ("https://h/v1",), "m"),
    ],
)
def test_the_parts_of_a_spec_and_its_text_again(text, backend, urls, model):
    spec = PolicySpec.parse(text)
    assert (spec.backend, spec.urls, spec.model) == (backend, urls, model)
    assert str(spec) == text


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("gpt", "unknown policy 'gpt'; use embedded"),
        ("embedded:x", "unknown policy 'embedded:x'"),
        ("vllm:localhost:8000", "give base URLs such as vllm:http://127.0.0.1:8000@MODEL"),
        ("openai:http://h", "name the model, as openai:http://h@MODEL"),
    ],
)
def test_a_malformed_spec_is_refused_in_one_line(text, said):
    with pytest.raises(PolicyError) as refused:
        PolicySpec.parse(text)
    assert said in str(refused.value) and "\n" not in str(refused.value)


def test_a_local_path_is_anchored_and_a_hub_id_or_url_is_not(tmp_path):
    (tmp_path / "model").mkdir()
    assert str(PolicySpec.parse("replay:demo.json").anchored(tmp_path)) == f"replay:{tmp_path / 'demo.json'}"
    assert str(PolicySpec.parse("transformers:model").anchored(tmp_path)) == f"transformers:{tmp_path / 'model'}"
    for kept in ("transformers:Qwen/Qwen2.5-Coder-0.5B-Instruct", "vllm:http://a:8000@m", "llama:embedded"):
        assert str(PolicySpec.parse(kept).anchored(tmp_path)) == kept
