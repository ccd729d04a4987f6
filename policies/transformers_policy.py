"""A local causal LM through transformers: the whole group is sampled in one batched `generate` call.

The per-token logprobs stored with each completion are those of the distribution actually sampled from (after
temperature, top-k and top-p), because the trainer treats them as the behaviour policy. transformers appends its
own temperature/top-k/top-p warpers *after* any `logits_processor` a caller passes, so a recorder passed there
would see unwarped scores. We therefore switch generate's warpers off and pass our own chain, with the recorder
last: what it sees is exactly what `torch.multinomial` draws from.

With `SamplingParams.structured` set, each row is held to the answer's shape instead (`policies.held_rows`): its
tokens are drawn in numpy among those the answer's language allows, and a greedy `generate` takes them.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from pathlib import Path
from typing import Any

from policies.answer_grammar import EDIT_FORMATS, AnswerShape
from policies.copy_guard import GuardCounts, RowGuard, TokenTexts, group_guard
from policies.embedded import EMBEDDED_NAME, INSTALL_HINT, embedded_model_dir
from policies.held_rows import HeldSampler, HeldVocab, VocabTexts
from policies.llama_grammar import GrammarCost
from policies.policy import Generated, PolicyError, SamplingParams, SamplingProgress, chat_token_ids, render_chat
from policies.prefill import PromptPrefill
from policies.stops import RowStops


def warper_chain(params: SamplingParams) -> list[Any]:
    """Temperature, then top-k, then top-p: the order vLLM applies them too. Temperature 0 is greedy, as vLLM and
    llama.cpp read it: the likeliest token alone, drawn with probability 1 (logprob 0)."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    if params.temperature <= 0.0:
        return [TopKLogitsWarper(1)]
    chain: list[Any] = []
    if params.temperature != 1.0:
        chain.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        chain.append(TopKLogitsWarper(params.top_k))
    if params.top_p < 1.0:
        chain.append(TopPLogitsWarper(params.top_p))
    return chain


# generate() arguments that switch off every warper transformers would append after the caller's processors
# (a model's generation_config may set some of them, e.g. top_k=20 for Qwen).
_NO_BUILTIN_WARPERS = {
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
}


class _LogprobRecorder:
    """Sees the fully processed scores of each step; the next call reveals which token was sampled from them."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._pending: Any = None
        self.steps: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self._take(input_ids[:, -1])
        self._pending = self._torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _take(self, tokens: Any) -> None:
        if self._pending is not None:
            self.steps.append(self._pending.gather(1, tokens[:, None]).squeeze(1))
            self._pending = None

    def finish(self, last_tokens: Any) -> Any:
        self._take(last_tokens)
        return self._torch.stack(self.steps, dim=1) if self.steps else None


class _Interrupted:
    """A stopping criterion checked between tokens: ends the whole batch once `interrupt()` was called."""

    def __init__(self, flag: threading.Event) -> None:
        self.flag = flag
        self.fired = False

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        self.fired = self.fired or self.flag.is_set()
        return torch.full((input_ids.shape[0],), self.fired, dtype=torch.bool, device=input_ids.device)

    def honoured(self) -> bool:
        """Whether an interrupt ended this call (or came after its last check); the request is consumed."""
        if not (self.fired or self.flag.is_set()):
            return False
        self.flag.clear()
        return True


class _CountTokens:
    """A stopping criterion that never stops: after each step it counts the rows still sampling into the live
    view's progress (a row is done once it holds an EOS or `RowStops` ended it)."""

    def __init__(self, progress: SamplingProgress, rows: RowStops, prompt_len: int, eos_ids: list[int]) -> None:
        self.progress, self.rows, self.prompt_len, self.eos_ids = progress, rows, prompt_len, eos_ids

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        new = input_ids[:, self.prompt_len :]
        ended = torch.isin(new, torch.tensor(self.eos_ids, device=new.device)).any(dim=1)
        for row in self.rows.ended:
            ended[row] = True
        done = int(ended.sum())
        # a row that ended this step sampled this step's token too
        self.progress.tokens += input_ids.shape[0] - self.progress.rows_done
        self.progress.rows_done = done
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class TransformersPolicy:
    max_concurrency = 1
    structured_formats = EDIT_FORMATS  # StructuredSampling: each row's tokens judged by its answer's matcher

    def __init__(self, model: Any, tokenizer: Any, name: str) -> None:
        self.model, self.tokenizer, self.name = model, tokenizer, name
        self.version = 0
        self.serving_base = False  # True after `serve_base`: samples with the adapter switched off
        self.device = next(model.parameters()).device
        eos = model.generation_config.eos_token_id
        eos_ids = eos if isinstance(eos, list) else [eos]
        self.eos_ids = [e for e in {*eos_ids, tokenizer.eos_token_id} if e is not None]
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.prefill = PromptPrefill.for_model(model)
        self._interrupt = threading.Event()
        self.progress = SamplingProgress()
        self._vocab_texts: VocabTexts | None = None  # decoded on the first structured call
        self._held: dict[AnswerShape, HeldVocab] = {}
        self.grammar_cost = GrammarCost()  # summed over every structured call, for the benchmarks
        self.copy_guard = GuardCounts()  # summed over every guarded call (`SamplingParams.avoid`)
        self._guard_texts: TokenTexts | None = None  # the vocabulary as the copy guard reads it (made once)
        self.notes = ""  # what whoever chose this policy adds (policies.from_spec: why not llama.cpp)

    @property
    def description(self) -> str:
        """Runtime and precision now: a trainer sharing the model may have made it float32 (policies/cpu_dtype.py)."""
        twin = ", prompt in a float32 twin" if self.prefill.runs_twin(self.model) else ""
        return f"transformers on {self.device.type}, {str(next(self.model.parameters()).dtype)[6:]}{twin}{self.notes}"

    def interrupt(self) -> None:
        """Stop the generation in flight within a token (Ctrl-C); its completions come back `interrupted`.

        Safe from any thread. A request that arrives between two calls ends the next call at its first token,
        so no interrupt is ever lost; each call that honours one clears it.
        """
        self._interrupt.set()

    def withdraw_interrupt(self) -> None:
        """Forget a request that came after the call it was meant for had ended (a run solved as its last group
        finished), so that it cannot end an unrelated later call."""
        self._interrupt.clear()

    @classmethod
    def load(cls, spec: str) -> TransformersPolicy:
        """`embedded`, a local directory, or a hub id (needs network access to the hub)."""
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
            from transformers.utils import logging as hf_logging
        except ImportError as exc:
            raise PolicyError(f"the transformers policy needs torch and transformers ({exc}); {INSTALL_HINT}") from None
        hf_logging.set_verbosity_error()  # the live view owns the terminal
        hf_logging.disable_progress_bar()
        path, name = (embedded_model_dir(), EMBEDDED_NAME) if spec == "embedded" else (spec, spec)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            # bfloat16 on a GPU; on a CPU the checkpoint's own dtype: the embedded cache is bfloat16 (~17 tok/s here
            # against ~10 in float32), while a float32 checkpoint keeps sampler and trainer logprobs equal to 1e-4
            dtype = torch.bfloat16 if device == "cuda" else "auto"
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
        except (OSError, ValueError) as exc:
            hint = f"delete {path} to rebuild the cache" if spec == "embedded" else "pass a model dir or hub id"
            raise PolicyError(f"cannot load model {spec!r}: {str(exc).splitlines()[0]}; {hint}") from None
        model.eval()
        return cls(model, tokenizer, name)

    def render(self, prompt: str) -> str:
        return render_chat(self.tokenizer, prompt)

    def generate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]:
        return self.generate_ids(chat_token_ids(self.tokenizer, prompt), params, n)

    def generate_ids(self, prompt_ids: list[int], params: SamplingParams, n: int) -> list[Generated]:
        """Sample n completions of an already rendered and tokenised prompt."""
        import torch

        if params.seed is not None:
            torch.manual_seed(params.seed)
        input_ids = torch.tensor([prompt_ids], device=self.device).repeat(n, 1)
        recorder = _LogprobRecorder()
        stopper = _Interrupted(self._interrupt)
        rows = RowStops(self.tokenizer, input_ids.shape[1], params.stop)
        counter = _CountTokens(self.progress, rows, input_ids.shape[1], self.eos_ids)
        held = None if params.structured is None else self._held_sampler(params, params.structured, n, rows)
        processors = [*warper_chain(params), recorder] if held is None else [held]
        self.progress.start(n, params.max_new_tokens, len(prompt_ids))
        try:
            with self._weights_served():
                criteria = [stopper, rows, counter]
                out = self._generate(input_ids, prompt_ids, params, processors, criteria, sample=held is None)
        finally:
            self.progress.active = False
            if held is not None:
                self.grammar_cost.add(held.cost())
        if stopper.honoured():
            return [Generated("", [], [], "interrupted", self.version) for _ in range(n)]
        new = out[:, input_ids.shape[1] :]
        if held is not None:
            logprobs: Any = held.row_logprobs()
        else:
            logprobs = recorder.finish(new[:, -1]) if new.shape[1] else None
        return [
            self._completion(new[i], None if logprobs is None else logprobs[i], rows.ended.get(i), rows.reasons.get(i))
            for i in range(n)
        ]

    def held_vocab(self, shape: AnswerShape) -> HeldVocab:
        """`shape` over this model's vocabulary (its token texts decoded on the first call, about 3 s for 152k
        ids; its whole-vocabulary masks remembered from group to group)."""
        if self._vocab_texts is None:
            self._vocab_texts = VocabTexts.of(self.tokenizer, self.model.config.vocab_size, self.eos_ids)
        held = self._held.get(shape)
        if held is None:
            held = self._held[shape] = HeldVocab(shape, self._vocab_texts)
        return held

    def _held_sampler(self, params: SamplingParams, shape: AnswerShape, n: int, stops: RowStops) -> HeldSampler:
        held = self.held_vocab(shape)
        guards = None
        group = group_guard(params, self.copy_guard)
        if group is not None:
            if self._guard_texts is None:
                self._guard_texts = TokenTexts(held.vocab.texts)
            guards = [RowGuard(group, self._guard_texts) for _ in range(n)]
        return HeldSampler(params, [held.row() for _ in range(n)], stops, self.eos_ids, guards)

    def _weights_served(self) -> Any:
        """The adapter switched off for the call after `serve_base`, else the model as it is."""
        if self.serving_base and hasattr(self.model, "disable_adapter"):
            return self.model.disable_adapter()
        return contextlib.nullcontext()

    def _generate(
        self,
        input_ids: Any,
        prompt_ids: list[int],
        params: SamplingParams,
        processors: list[Any],
        criteria: list[Any],
        sample: bool,
    ) -> Any:
        """One batched `generate` call. The prompt runs once, not n times: generate() feeds only the last prompt
        token on top of the cache of the others. `sample`: transformers draws from the scores `processors` leave;
        else the last processor has drawn each row's token already (`HeldSampler`) and greedy decoding takes it."""
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        cached = {}
        if len(prompt_ids) > 1:
            weights = (self.version, self.serving_base)
            cached["past_key_values"] = self.prefill.cache(self.model, weights, prompt_ids[:-1], input_ids.shape[0])
        with torch.no_grad(), warnings.catch_warnings():
            # transformers 5 renamed past_key_values to `cache`; the old name is the one 4.x and 5.x both take
            warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)
            return self.model.generate(
                input_ids,
                attention_mask=torch.ones_like(input_ids),
                **cached,
                do_sample=sample,
                **_NO_BUILTIN_WARPERS,
                max_new_tokens=params.max_new_tokens,
                eos_token_id=self.eos_ids,
                pad_token_id=self.pad_id,
                logits_processor=LogitsProcessorList(processors),
                stopping_criteria=StoppingCriteriaList(criteria),
            )

    def _completion(self, tokens: Any, logprobs: Any, ended: int | None, reason: str | None) -> Generated:
        """Cut a row at its first EOS or where `RowStops` ended it, whichever came first: every later position
        holds padding, not a sampled token."""
        ids = tokens.tolist()
        finish = "length"
        for pos, tok in enumerate(ids):
            if tok in self.eos_ids:
                ids, finish = ids[: pos + 1], "stop"
                break
        if ended is not None and (ended < len(ids) or (ended == len(ids) and finish == "length")):
            ids, finish = ids[:ended], reason or "stop"
        lps = [] if logprobs is None else logprobs[: len(ids)].tolist()
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return Generated(text, ids, lps, finish, self.version)

    def publish(self, adapter_dir: str | Path, version: int) -> None:
        """Swap in a LoRA adapter between groups; completions sampled afterwards carry `version`."""
        from peft import PeftModel, set_peft_model_state_dict
        from safetensors.torch import load_file

        weights = Path(adapter_dir) / "adapter_model.safetensors"
        if not weights.is_file():
            raise PolicyError(f"{adapter_dir}: no adapter_model.safetensors to publish")
        if isinstance(self.model, PeftModel):
            set_peft_model_state_dict(self.model, load_file(str(weights), device=str(self.device)))
        else:
            self.model = PeftModel.from_pretrained(self.model, str(adapter_dir), is_trainable=True).to(self.device)
        self.model.eval()
        self.serving_base, self.version = False, version

    def serve_base(self, version: int) -> None:
        """Sample with the adapter switched off from now on, as `version` (its weights stay, for the trainer that
        shares this model); the next `publish` switches it on again."""
        self.serving_base, self.version = True, version

    def close(self) -> None:
        self.model = None
