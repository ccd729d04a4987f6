"""The prompt's KV cache, computed once per group and shared by its n samples.

`generate` on a batch of n copies of one prompt runs the prompt n times. On a CPU the prompt pass dominates a
group: ~800 prompt tokens against a few hundred sampled ones. Two measured facts on a 2-core AVX2 machine with
the 0.5B embedded model (see docs/policies.md): prefilling 634 tokens took 35.6 s in bfloat16 but 5.8 s in
float32 (without native bf16 instructions, bf16 matrix products run at ~17 GFLOP/s whatever their size, float32
ones at ~108), while one decoding step of 4 sequences took 268 ms in bfloat16 and 423 ms in float32. So we
prefill once at batch 1, in float32 where the CPU lacks native bf16 (a float32 twin of the model, rebuilt when an
adapter is published), and decode in the model's own dtype.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable
from typing import Any

from policies.cpu_dtype import slow_bf16


def _cast_cache(cache: Any, dtype: Any) -> None:
    if hasattr(cache, "layers"):  # transformers >= 4.56
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys.to(dtype), layer.values.to(dtype)
    else:
        cache.key_cache = [k.to(dtype) for k in cache.key_cache]
        cache.value_cache = [v.to(dtype) for v in cache.value_cache]


class PromptPrefill:
    """Builds the cache that `generate(past_key_values=...)` continues from: all prompt tokens but the last."""

    def __init__(self, use_float32_twin: bool) -> None:
        self.use_float32_twin = use_float32_twin
        self._twin: Any = None
        self._twin_of: tuple[int, Hashable] | None = None

    @classmethod
    def for_model(cls, model: Any) -> PromptPrefill:
        return cls(use_float32_twin=slow_bf16(model))

    def runs_twin(self, model: Any) -> bool:
        """Whether the prompt of `model` runs through the twin: not once a trainer has made the model float32."""
        import torch

        return self.use_float32_twin and next(model.parameters()).dtype != torch.float32

    @property
    def twin(self) -> Any:
        """The float32 copy the prompt runs through now (None before the first prompt, or without a twin)."""
        return self._twin

    def cache(self, model: Any, weights: Hashable, prompt_ids: list[int], n: int) -> Any:
        """`weights` names the weights: every change of weights (a publish, a rollback, a swapped model
        object) comes with new `weights` or a new object, and then the twin is copied again."""
        import torch

        device, runner = next(model.parameters()).device, model
        if self.runs_twin(model):
            if self._twin_of != (id(model), weights):
                self._twin = None  # free the old copy before making the new one
                self._twin = copy.deepcopy(model).float().eval()  # an adapter switched off stays off in the copy
                self._twin_of = (id(model), weights)
            runner = self._twin
        with torch.no_grad():
            out = runner(input_ids=torch.tensor([prompt_ids], device=device), use_cache=True)
        cache = out.past_key_values
        if runner is not model:
            _cast_cache(cache, next(model.parameters()).dtype)
        if n > 1:
            cache.batch_repeat_interleave(n)
        return cache
