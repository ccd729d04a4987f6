"""`llama:PATH.gguf` with the GGUF file alone in its folder: the tokenizer is the one the file holds (its tokens,
merges, special ids and chat template, read by transformers' GGUF support), so a Qwen2-family GGUF runs as it is.

The model is a tiny Qwen2 made on the spot whose tokenizer is shaped as Qwen2's (its pre-tokenizer split, a merge,
a chat template); its GGUF is written by policies/gguf_export.py. The same file loaded beside its tokenizer files
is the reference: the lone file must tokenise, lay out the chat and sample exactly as it does.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from policies.from_spec import make_policy
from policies.policy import SamplingParams, chat_token_ids
from tests.helpers import need_llama

CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEXT = "def solve(x):\n    return x * x  # ü, 日本\n"


def _qwen2_shaped_tokenizer():
    """Byte-level BPE with Qwen2's split, one merge (two spaces), chat markers and a template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab["ĠĠ"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "Ġ")]))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    fast.chat_template = CHAT
    return fast


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A tiny Qwen2 with its tokenizer files and its GGUF side by side."""
    from policies.gguf_export import write_model_gguf
    from policies.tiny import tiny_model

    need_llama()
    folder = tmp_path_factory.mktemp("beside") / "tiny"
    tokenizer = _qwen2_shaped_tokenizer()
    tiny_model(tokenizer, seed=3).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_model_gguf(folder, folder / "model.gguf")
    return folder


def test_a_gguf_alone_in_its_folder_tokenises_and_samples_as_with_its_tokenizer_files(
    model_folder, tmp_path, monkeypatch
):
    monkeypatch.setenv("EVOLVE_CACHE", str(tmp_path / "cache"))
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(model_folder / "model.gguf", alone / "tiny-q.gguf")
    reference = make_policy(f"llama:{model_folder / 'model.gguf'}")
    lone = make_policy(f"llama:{alone / 'tiny-q.gguf'}")
    try:
        assert lone.tokenizer(TEXT).input_ids == reference.tokenizer(TEXT).input_ids
        assert lone.tokenizer.decode(lone.tokenizer(TEXT).input_ids) == TEXT
        assert chat_token_ids(lone.tokenizer, "square it") == chat_token_ids(reference.tokenizer, "square it")
        assert lone.eos_ids == reference.eos_ids == {reference.tokenizer.convert_tokens_to_ids("<|im_end|>")}
        params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=12, seed=5)
        got = [g.token_ids for g in lone.generate("square it", params, 3)]
        want = [g.token_ids for g in reference.generate("square it", params, 3)]
        assert got == want and all(got)
    finally:
        lone.close()
        reference.close()
    # Read from the file once (minutes for a 152k vocabulary on a busy machine), then from the model cache.
    cached = list((tmp_path / "cache" / "tokenizers").glob("*/tokenizer.json"))
    assert len(cached) == 1
    again = make_policy(f"llama:{alone / 'tiny-q.gguf'}")
    try:
        assert again.tokenizer(TEXT).input_ids == lone.tokenizer(TEXT).input_ids
    finally:
        again.close()


def test_a_gguf_without_a_readable_tokenizer_is_one_clear_error(tmp_path, monkeypatch):
    from policies.policy import PolicyError

    need_llama()
    monkeypatch.setenv("EVOLVE_CACHE", str(tmp_path / "cache"))
    fake = tmp_path / "broken.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 64)
    said = r"broken\.gguf: neither tokenizer files beside it nor a tokenizer in the file"
    with pytest.raises(PolicyError, match=said) as caught:
        make_policy(f"llama:{fake}")
    assert "\n" not in str(caught.value)
