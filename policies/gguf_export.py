"""Writing GGUF files with the `gguf` package: a whole Qwen2 model, and a LoRA adapter for llama.cpp.

The adapter is how a trained policy version reaches the llama.cpp sampler without a restart: the trainer
saves a peft adapter (safetensors), this module rewrites it as a GGUF LoRA adapter (the same A and B
matrices in float32, named after the base model's GGUF tensors), and llama.cpp applies it on top of the
unchanged quantised base weights.

The whole-model writer exists so that tests can run llama.cpp on a tiny model made on the spot (no download):
float32 tensors, the tokenizer's vocabulary as a byte-level BPE vocabulary (llama.cpp needs one to load; the
policy tokenises with the transformers tokenizer anyway, so token ids are the same on both sides), and its chat
template, so that the file alone carries its tokenizer as a published GGUF does (`policies.gguf_tokenizer`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ARCH = "qwen2"


def _name_map(n_blocks: int) -> Any:
    import gguf

    return gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, n_blocks)


def _gguf_name(names: Any, hf_name: str) -> str:
    mapped = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
    if mapped is None:
        raise ValueError(f"no GGUF name for tensor {hf_name}")
    return mapped


def write_model_gguf(model_dir: Path, target: Path) -> Path:
    """A Qwen2 checkpoint directory (safetensors + tokenizer) as one float32 GGUF file."""
    import gguf
    import numpy as np
    from transformers import AutoTokenizer

    config = json.loads((model_dir / "config.json").read_text())
    if config.get("model_type") != ARCH:
        raise ValueError(f"{model_dir}: only qwen2 checkpoints can be written as GGUF here")
    tensors: dict[str, np.ndarray] = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        tensors.update(_load_float32(file))
    n_blocks = int(config["num_hidden_layers"])
    writer = gguf.GGUFWriter(str(target), ARCH)
    writer.add_context_length(int(config.get("max_position_embeddings", 4096)))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_block_count(n_blocks)
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_head_count_kv(int(config.get("num_key_value_heads", config["num_attention_heads"])))
    writer.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-6)))
    rope = config.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", config.get("rope_theta", 10000.0))))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_vocabulary(writer, AutoTokenizer.from_pretrained(model_dir), int(config["vocab_size"]))
    names = _name_map(n_blocks)
    for hf_name, value in tensors.items():
        if hf_name == "lm_head.weight" and config.get("tie_word_embeddings"):
            continue
        writer.add_tensor(_gguf_name(names, hf_name), np.ascontiguousarray(value, dtype=np.float32))
    _finish(writer)
    return target


def _add_vocabulary(writer: Any, tokenizer: Any, vocab_size: int) -> None:
    """The tokenizer's tokens by id (padded to the model's vocabulary size) and its BPE merges."""
    import gguf

    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    special = set(tokenizer.all_special_ids)
    tokens, types = [], []
    for i in range(vocab_size):
        tokens.append(by_id.get(i, f"[PAD{i}]"))
        types.append(gguf.TokenType.CONTROL if i in special or i not in by_id else gguf.TokenType.NORMAL)
    backend = json.loads(tokenizer.backend_tokenizer.to_str())
    merges = [m if isinstance(m, str) else " ".join(m) for m in backend["model"].get("merges", [])]
    if not merges:  # llama.cpp refuses a BPE vocabulary without merges; one merge of two byte tokens is harmless
        merges = [f"{tokens[0]} {tokens[1]}"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2" if _splits_as_qwen2(backend.get("pre_tokenizer")) else "default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id < vocab_size:
        writer.add_eos_token_id(tokenizer.eos_token_id)
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id < vocab_size:
        writer.add_pad_token_id(tokenizer.pad_token_id)
    if getattr(tokenizer, "chat_template", None):
        writer.add_chat_template(tokenizer.chat_template)


def _splits_as_qwen2(pre_tokenizer: Any) -> bool:
    """Whether a tokenizer.json pre-tokenizer splits text with Qwen2's pattern (written as the `qwen2` pre-tokenizer,
    so that a reader of the GGUF splits as the model's merges were learned)."""
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    if isinstance(pre_tokenizer, dict):
        pattern = pre_tokenizer.get("pattern")
        if isinstance(pattern, dict) and pattern.get("Regex") == PRETOKENIZE_REGEX:
            return True
        return any(_splits_as_qwen2(p) for p in pre_tokenizer.get("pretokenizers") or [])
    return False


def write_lora_gguf(adapter_dir: Path, target: Path, n_blocks: int) -> Path:
    """A peft LoRA adapter directory (adapter_config.json + adapter_model.safetensors) as a GGUF adapter."""
    import gguf
    import numpy as np

    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    if config.get("use_dora") or config.get("use_rslora"):
        raise ValueError(f"{adapter_dir}: DoRA/rsLoRA adapters cannot be served by llama.cpp here")
    weights = _peft_tensors(adapter_dir / "adapter_model.safetensors")
    names = _name_map(n_blocks)
    staging = target.with_name(target.name + ".partial")
    writer = gguf.GGUFWriter(str(staging), ARCH)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", float(config["lora_alpha"]))
    for base, pair in sorted(weights.items()):
        if set(pair) != {"a", "b"}:
            raise ValueError(f"{adapter_dir}: {base} lacks its lora_A or lora_B matrix")
        name = _gguf_name(names, base + ".weight")
        writer.add_tensor(name + ".lora_a", np.ascontiguousarray(pair["a"], dtype=np.float32))
        writer.add_tensor(name + ".lora_b", np.ascontiguousarray(pair["b"], dtype=np.float32))
    _finish(writer)
    staging.replace(target)
    return target


def _load_float32(file: Path) -> dict[str, Any]:
    """A safetensors file as float32 numpy arrays (through torch: numpy has no bfloat16)."""
    from safetensors.torch import load_file

    return {name: t.float().numpy() for name, t in load_file(str(file)).items()}


def _peft_tensors(file: Path) -> dict[str, dict[str, Any]]:
    """`base_model.model.<module>.lora_A.weight` → {<module>: {"a": A, "b": B}}; A is (r, in), B is (out, r)."""
    import numpy as np

    out: dict[str, dict[str, Any]] = {}
    for key, value in _load_float32(file).items():
        module, _, tail = key.removeprefix("base_model.model.").rpartition(".lora_")
        if tail not in ("A.weight", "B.weight"):
            raise ValueError(f"{file}: unexpected adapter tensor {key}")
        out.setdefault(module, {})[tail[0].lower()] = np.asarray(value, dtype=np.float32)
    return out


def _finish(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
