"""Tiny causal LMs made on the spot (byte-level tokenizer, Qwen2 architecture, h128, 2 layers).

Tests and benchmarks use them instead of a hub download: real forward passes, real sampling, a real
LoRA step in well under a second. `teach` fits one briefly on a few (prompt, completion) pairs so that
what it samples afterwards parses; that takes a few seconds on a CPU.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

EOS, PAD = "<|eos|>", "<|pad|>"


def tiny_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab[EOS], vocab[PAD] = len(vocab), len(vocab) + 1
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)


def tiny_model(
    tokenizer: Any,
    seed: int = 0,
    hidden: int = 128,
    layers: int = 2,
    vocab_size: int | None = None,
    sliding_window: int | None = None,
) -> Any:
    """`vocab_size` below len(tokenizer) leaves the special tokens out of reach: such a model never stops by
    itself, which is what tests of interrupting a generation need. `sliding_window`: every layer after the first
    attends to that many positions only, and its cache keeps no more."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    vocab = vocab_size or len(tokenizer)
    window = {"use_sliding_window": True, "sliding_window": sliding_window, "max_window_layers": 1}
    window = {} if sliding_window is None else window
    eos = tokenizer.eos_token_id if tokenizer.eos_token_id < vocab else None
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id < vocab else None
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        eos_token_id=eos,
        pad_token_id=pad,
        tie_word_embeddings=True,
        **window,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    return model


def teach(model: Any, tokenizer: Any, pairs: Sequence[tuple[str, str]], steps: int = 120, lr: float = 1e-3) -> None:
    """Full fine-tune on the completion tokens (prompt tokens masked) until it has learned them."""
    import torch

    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    batches = []
    for prompt, completion in pairs:
        p = tokenizer(prompt, add_special_tokens=False).input_ids
        c = [*tokenizer(completion, add_special_tokens=False).input_ids, tokenizer.eos_token_id]
        ids = torch.tensor([p + c])
        labels = torch.tensor([[-100] * len(p) + c])
        batches.append((ids, labels))
    for step in range(steps):
        ids, labels = batches[step % len(batches)]
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def build_taught_model(directory: Path, pairs: Sequence[tuple[str, str]], steps: int = 120, seed: int = 0) -> Path:
    """Make (or reuse) a taught tiny model saved in `directory`. The key covers the pairs, the teaching settings,
    this module's code and the library versions, so a shared cache never serves a stale model; the model is
    written under a private name and renamed into place, so concurrent builders never see half a model."""
    import torch
    import transformers

    recipe = (list(pairs), steps, seed, Path(__file__).read_text(), torch.__version__, transformers.__version__)
    key = hashlib.sha256(repr(recipe).encode()).hexdigest()[:12]
    target = directory / f"tiny-{key}"
    if (target / "config.json").exists():
        return target
    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=seed)
    teach(model, tokenizer, pairs, steps=steps)
    staging = directory / f".tiny-{key}.{os.getpid()}"
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.rename(target)
    except OSError:  # another process finished first: keep its copy
        shutil.rmtree(staging, ignore_errors=True)
    return target
