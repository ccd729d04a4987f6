"""`vllm-local:MODEL`: vLLM in this process (the `vllm` extra). New adapters become new `LoRARequest`s.

A group asked for in the answer's shape is held to its GBNF grammar (policies/answer_grammar.py), passed as vLLM
takes one in process: `SamplingParams(structured_outputs=StructuredOutputsParams(grammar=...))` from vLLM 0.10.2
on, `SamplingParams(guided_decoding=GuidedDecodingParams(grammar=...))` before (removed in 0.12.0). The grammar
is sent unconverted: xgrammar, vLLM's default backend, reads llama.cpp's GBNF (policies/http_grammar.py). With
`processed_logprobs` the stored logprob is that of the masked, warped distribution the token was drawn from.
Not run by this project's tests: vLLM needs a GPU and is not installed there.
"""

from __future__ import annotations

import os
from typing import Any

from policies.answer_grammar import EDIT_FORMATS, AnswerShape, answer_gbnf
from policies.policy import SYSTEM, Generated, PolicyError, SamplingParams


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
        self.structured_formats = EDIT_FORMATS if _grammar_kwargs(AnswerShape(1, "full")) else ()
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
            **(_grammar_kwargs(params.structured) if params.structured is not None else {}),
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


def _grammar_kwargs(shape: AnswerShape) -> dict[str, Any]:
    """The `SamplingParams` keyword that holds a completion to `shape`'s grammar, in this vLLM's name for it; none
    where this vLLM has neither (the policy then says it cannot: `structured_formats` is empty)."""
    gbnf = answer_gbnf(shape)
    try:
        from vllm.sampling_params import StructuredOutputsParams  # vLLM 0.10.2 on
    except ImportError:
        try:
            from vllm.sampling_params import GuidedDecodingParams  # before 0.10.2
        except ImportError:
            return {}
        return {"guided_decoding": GuidedDecodingParams(grammar=gbnf)}
    return {"structured_outputs": StructuredOutputsParams(grammar=gbnf)}
