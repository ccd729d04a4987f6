"""`vllm-local:MODEL`: vLLM in this process (the `vllm` extra). New adapters become new `LoRARequest`s."""

from __future__ import annotations

import os
from typing import Any

from policies.base import SYSTEM, Generated, PolicyError, SamplingParams


class VLLMLocalPolicy:
    max_concurrency = 1

    def __init__(self, model: str, max_lora_rank: int = 64) -> None:
        try:
            from vllm import LLM
        except ImportError:
            raise PolicyError("vllm-local needs vLLM: pip install 'vpo-evolve[vllm]' on a CUDA machine") from None
        self.llm: Any = LLM(
            model=model,
            enable_lora=True,
            max_lora_rank=max_lora_rank,
            max_loras=2,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
        )
        self.tokenizer = self.llm.get_tokenizer()
        self.name, self.version = f"vllm-local:{model}", 0
        self._lora: Any = None

    def generate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]:
        from vllm import SamplingParams as VSampling

        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        sampling = VSampling(
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_new_tokens,
            seed=params.seed,
            logprobs=0,
            stop=list(params.stop) or None,
            include_stop_str_in_output=True,
        )
        version, lora = self.version, self._lora
        (result,) = self.llm.generate([{"prompt_token_ids": ids}], sampling, lora_request=lora, use_tqdm=False)
        out = []
        for c in result.outputs:
            lps = [step[tok].logprob for tok, step in zip(c.token_ids, c.logprobs or [], strict=False)]
            out.append(Generated(c.text, list(c.token_ids), lps or None, c.finish_reason, version))
        return out

    def publish(self, adapter_dir: str | os.PathLike[str], version: int) -> None:
        from vllm.lora.request import LoRARequest

        self._lora = LoRARequest(f"policy-v{version}", version, str(adapter_dir))
        self.version = version

    def serve_base(self, version: int) -> None:
        """Requests name no adapter from now on."""
        self._lora, self.version = None, version

    def close(self) -> None:
        self.llm = None
