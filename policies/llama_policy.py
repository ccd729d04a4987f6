"""A GGUF model through llama.cpp: the prompt computed once, the G rows of a group decoded together.

Why: on a 2-core CPU without native bf16 a decoding step is bound by reading the weights from memory, and
the Q4_K_M weights llama.cpp reads are a quarter of the bf16 ones transformers reads; one step that carries
all G rows costs little more than a step of one row. So a group is:

1. the prompt decoded into sequence 0, from the first token where it differs from the previous group's
   prompt (the problem's fixed text comes first in every prompt, so later groups skip it);
2. sequence 0 copied to sequences 1..G (a unified KV cache shares the cells, nothing is copied);
3. steps of one batch holding the newest token of every unfinished row, each row's next token drawn in
   numpy from its logits (`policies.sampling`), which gives the exact logprob of the distribution it was
   drawn from, after temperature, top-k and top-p: the behaviour policy the trainer divides by.

With `SamplingParams.structured` set, each row also holds a grammar state of the answer's shape
(`policies.llama_grammar`, `policies.answer_grammar`) and each token is drawn among those it allows
(`policies.sampling.constrained_distribution`), its logprob that of the masked distribution.

Rows end at EOS, a stop string, a loop (`policies.stops`), or `max_new_tokens`. Ctrl-C ends a call between
two steps, or inside a prompt's decode through llama.cpp's abort callback. A new LoRA version is written as a
GGUF adapter and applied to the context without reloading the model.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from policies.answer_grammar import EDIT_FORMATS, answer_gbnf
from policies.copy_guard import GuardCounts, RowGuard, TokenTexts, both, group_guard
from policies.core_share import CoreShare, EvaluationsInFlight
from policies.llama_grammar import GrammarBook, GrammarCost, RowGrammar
from policies.llama_runtime import DecodeAborted, Entry, LlamaRuntime, default_threads, requantize_q8_0
from policies.policy import Generated, PolicyError, SamplingParams, SamplingProgress, chat_token_ids, render_chat
from policies.sampling import TokenSampler
from policies.stops import end_reason

PREFILL_CHUNK = 256  # prompt tokens per decode call (llama.cpp's n_batch)


class _Held(NamedTuple):
    """What holds one row's next token: its grammar state and its copy guard (either may be None)."""

    grammar: RowGrammar | None
    guard: RowGuard | None


@dataclass
class _Row:
    seq: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str | None = None


class LlamaPolicy:
    max_concurrency = 1
    structured_formats = EDIT_FORMATS  # StructuredSampling: llama.cpp's grammar engine masks each row

    def __init__(
        self,
        gguf: Path,
        tokenizer: Any,
        name: str,
        trainer_model: str,
        eos_ids: set[int],
        threads: int | None = None,
        in_flight: EvaluationsInFlight | None = None,
    ) -> None:
        self.name, self.tokenizer, self.trainer_model = name, tokenizer, trainer_model
        self.version = 0
        self.progress = SamplingProgress()
        self._interrupt = threading.Event()
        self.threads = threads or default_threads()
        self.cores = CoreShare(self.threads)
        if in_flight is not None:
            self.share_cores(in_flight)
        self.runtime = LlamaRuntime(gguf, self.cores.threads, self._interrupt)
        self.gguf = gguf
        self.eos_ids = eos_ids
        self._cached: list[int] = []  # the prompt tokens whose cells sequence 0 holds
        self.grammars = GrammarBook(self.runtime.lib, self.runtime.vocab, self.runtime.n_vocab, eos_ids)
        self.grammar_cost = GrammarCost()  # summed over every structured call, for the benchmarks
        self.copy_guard = GuardCounts()  # summed over every guarded call (`SamplingParams.avoid`)
        self._guard_texts: TokenTexts | None = None  # the vocabulary as the copy guard reads it (made once)

    @property
    def description(self) -> str:
        return f"llama.cpp on {self.gguf.name}, {self.cores.describe()}, a group's rows decoded in one batch"

    def share_cores(self, in_flight: EvaluationsInFlight) -> None:
        """SharesCores: decode with a thread fewer for each evaluation `in_flight` counts (policies/core_share.py),
        set before every decode call."""
        self.cores.in_flight, self.cores.shared = in_flight, True

    @classmethod
    def load(cls, spec: str) -> LlamaPolicy:
        """`embedded`, `embedded-1.5b` (the strong model's extra), or a GGUF file: its tokenizer is the transformers
        one in its folder where there is one, else the one the file holds (`policies.gguf_tokenizer`); to train, its
        folder holds the same model as a transformers checkpoint."""
        from policies.embedded import (
            EMBEDDED_NAME,
            Q8_NAME,
            STRONG_NAME,
            STRONG_SPEC,
            cache_root,
            embedded_gguf,
            embedded_model_dir,
            embedded_ready,
            strong_gguf,
            strong_ready,
        )
        from policies.gguf_tokenizer import model_tokenizer
        from policies.quiet_build import quiet_build

        try:
            from transformers.utils import logging as hf_logging
        except ImportError as exc:
            raise PolicyError(f"the llama policy tokenises with transformers ({exc})") from None
        hf_logging.set_verbosity_error()
        if spec == "embedded":  # the first run prepares it, its logs in the cache's build log (policies/quiet_build.py)
            with quiet_build(cache_root(), "the embedded model", not embedded_ready()):
                shipped = embedded_gguf()
                gguf = requantize_q8_0(shipped, shipped.with_name(Q8_NAME))
                source, name, trainer = embedded_model_dir(), EMBEDDED_NAME, "embedded"
        elif spec == STRONG_SPEC:  # sampled as shipped (Q4_K_M); its tokenizer is the GGUF's
            with quiet_build(cache_root(), "the strong embedded model", not strong_ready()):
                gguf = strong_gguf()
                model_tokenizer(gguf.parent, gguf)  # read from the file into the cache, once
            source, name, trainer = gguf.parent, STRONG_NAME, str(gguf.parent)
        else:
            gguf = Path(spec)
            if not gguf.is_file():
                raise PolicyError(
                    f"llama:{spec}: no such GGUF file; use llama:embedded, llama:{STRONG_SPEC} or llama:PATH.gguf"
                )
            source, name, trainer = gguf.parent, gguf.name, str(gguf.parent)
        tokenizer = model_tokenizer(Path(source), gguf)  # the files beside the GGUF, else the one it holds
        return cls(gguf, tokenizer, name, trainer, end_of_turn_ids(Path(source), tokenizer))

    # ---- Interruptible ----------------------------------------------------------------------------------
    def interrupt(self) -> None:
        """End the call in flight between two tokens (or inside a prompt decode); a request that finds no call
        ends the next one at its start, unless withdrawn."""
        self._interrupt.set()

    def withdraw_interrupt(self) -> None:
        self._interrupt.clear()

    def _honour_interrupt(self) -> bool:
        if not self._interrupt.is_set():
            return False
        self._interrupt.clear()
        return True

    # ---- sampling ---------------------------------------------------------------------------------------
    def render(self, prompt: str) -> str:
        return render_chat(self.tokenizer, prompt)

    def generate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]:
        return self.generate_ids(chat_token_ids(self.tokenizer, prompt), params, n)

    def generate_ids(
        self, prompt_ids: list[int], params: SamplingParams, n: int, *, gbnf: str | None = None
    ) -> list[Generated]:
        """Sample n completions of an already rendered and tokenised prompt. `gbnf`: a grammar given as GBNF text
        holds every row in place of `params.structured`'s (a server that serves this policy reads its requests'
        grammars as text: tests/vllm_server.py)."""
        if not prompt_ids or max(prompt_ids) >= self.runtime.n_vocab:
            raise PolicyError(f"the prompt needs at least one token, all below the model's {self.runtime.n_vocab}")
        self.progress.start(n, params.max_new_tokens, len(prompt_ids))
        try:
            with self.runtime.held():  # the rows' grammars read the model's vocabulary: close() waits for them too
                try:
                    rows = self._sample(prompt_ids, params, n, gbnf)
                except DecodeAborted:
                    self._cached = []  # an aborted decode leaves cells in an unknown state
                    self.runtime.clear()
                    rows = None
        finally:
            self.progress.active = False
        # The interrupt is spent by the call it ended, however it ended (mid-decode, between steps, or before a
        # row started): a flag left set would end every later call too (a second search on the same policy).
        if self._honour_interrupt() or rows is None:
            return [Generated("", [], [], "interrupted", self.version) for _ in range(n)]
        return [self._completion(r) for r in rows]

    def _sample(self, prompt_ids: list[int], params: SamplingParams, n: int, gbnf: str | None) -> list[_Row] | None:
        runtime = self.runtime
        if runtime.ensure_context(len(prompt_ids) + n * params.max_new_tokens + 1, n + 1, PREFILL_CHUNK):
            self._cached = []
        logits = self._prefill(prompt_ids)
        rows = [_Row(seq=i + 1) for i in range(n)]
        for row in rows:
            runtime.trim(row.seq, 0)
            runtime.copy(0, row.seq)
        sampler = TokenSampler(params)
        stop = tuple(s for s in params.stop if s)
        step_logits = [logits] * n
        grammars: dict[int, RowGrammar] = {}
        guards = self._row_guards(params, n)
        try:
            grammars.update(self._row_grammars(params, n, gbnf))
            while True:
                if self._interrupt.is_set():
                    return None
                live = [r for r in rows if r.finish is None]
                for row, row_logits in zip(live, step_logits, strict=True):
                    held = _Held(grammars.get(row.seq), guards.get(row.seq))
                    self._step(row, row_logits, sampler, held, params, stop)
                live = [r for r in rows if r.finish is None]
                if not live:
                    return rows
                base = len(prompt_ids) - 1
                entries = [Entry(r.ids[-1], base + len(r.ids), r.seq, True) for r in live]
                step_logits = list(runtime.decode(entries))
        finally:
            for row in rows:
                runtime.trim(row.seq, 0)
            for grammar in grammars.values():
                self.grammar_cost.add(grammar.cost)
                grammar.close()

    def _row_grammars(self, params: SamplingParams, n: int, gbnf: str | None) -> dict[int, RowGrammar]:
        """A fresh grammar state per row sequence: of `gbnf` where given, else of the answer's shape, or none for
        free text."""
        if gbnf is None and params.structured is not None:
            gbnf = answer_gbnf(params.structured)
        if gbnf is None:
            return {}
        return {seq: self.grammars.row(gbnf) for seq in range(1, n + 1)}

    def _row_guards(self, params: SamplingParams, n: int) -> dict[int, RowGuard]:
        """A copy guard per row sequence, sharing the group's known codes, where the call gives codes to avoid and
        its answer is held to whole rewrites (each fenced block a whole editable block); none otherwise."""
        group = group_guard(params, self.copy_guard)
        if group is None:
            return {}
        return {seq: RowGuard(group, self.guard_texts()) for seq in range(1, n + 1)}

    def guard_texts(self) -> TokenTexts:
        """Each token id's text, decoded once (about 2 s for 152k ids) on the first guarded call; none for a
        special token (a chat or end-of-turn marker: the completion's text drops it)."""
        if self._guard_texts is None:
            special = set(self.tokenizer.all_special_ids) | set(getattr(self.tokenizer, "added_tokens_decoder", {}))
            texts = [None if i in special else self.tokenizer.decode([i]) for i in range(self.runtime.n_vocab)]
            self._guard_texts = TokenTexts(texts)
        return self._guard_texts

    def _step(
        self,
        row: _Row,
        logits: Any,
        sampler: TokenSampler,
        held: _Held,
        params: SamplingParams,
        stop: tuple[str, ...],
    ) -> None:
        """Draw the row's next token (among those its grammar allows, if it has one, and off a copy where its guard
        turns it) and see whether it ends."""
        grammar, guard = held
        shape = grammar.allowed if grammar is not None else None
        turned = guard.turn(logits, params.temperature, shape) if guard is not None else None
        allowed = both(shape, turned)
        drawn = sampler.draw(logits) if allowed is None else sampler.draw_held(logits, allowed)
        if drawn is None:  # the grammar allows nothing more: the answer is as complete as it can be
            row.finish = "stop"
        else:
            row.ids.append(drawn[0])
            row.logprobs.append(drawn[1])
            row.finish = self._finish(row, params, stop)
            if grammar is not None and row.finish is None:
                grammar.accept(drawn[0])
            if guard is not None:
                guard.accept(drawn[0])
            self.progress.tokens += 1
        self.progress.rows_done += row.finish is not None

    def _prefill(self, prompt_ids: list[int]) -> Any:
        """Bring sequence 0 to the prompt, decoding only from the first token that differs from the cached
        prompt (at least the last one, whose logits start every row); its last token's logits."""
        same = 0
        for a, b in zip(self._cached, prompt_ids, strict=False):
            if a != b:
                break
            same += 1
        same = min(same, len(prompt_ids) - 1)
        self.runtime.trim(0, same)
        self._cached = prompt_ids[:same]
        self.progress.prompt_tokens = len(prompt_ids) - same
        logits = self.runtime.prefill(prompt_ids[same:], 0, same, PREFILL_CHUNK)
        self._cached = list(prompt_ids)
        return logits

    def _finish(self, row: _Row, params: SamplingParams, stop: tuple[str, ...]) -> str | None:
        if row.ids[-1] in self.eos_ids:
            return "stop"
        reason = end_reason(self.tokenizer, row.ids, stop)
        if reason:
            return reason
        return "length" if len(row.ids) >= params.max_new_tokens else None

    def _completion(self, row: _Row) -> Generated:
        text = self.tokenizer.decode(row.ids, skip_special_tokens=True)
        return Generated(text, row.ids, row.logprobs, row.finish, self.version)

    # ---- new versions -----------------------------------------------------------------------------------
    def publish(self, adapter_dir: str | Path, version: int) -> None:
        """Serve a peft LoRA adapter (as written by the trainer) between groups, without reloading the model;
        completions sampled afterwards carry `version`. The prompt cache was computed with the old weights,
        so it is dropped."""
        from policies.gguf_export import write_lora_gguf

        directory = Path(adapter_dir)
        if not (directory / "adapter_model.safetensors").is_file():
            raise PolicyError(f"{adapter_dir}: no adapter_model.safetensors to publish")
        gguf = write_lora_gguf(directory, directory / "adapter.gguf", self.runtime.n_layer)
        self.runtime.load_adapter(gguf)
        self._weights_changed(version)

    def serve_base(self, version: int) -> None:
        """Drop the adapter: the GGUF model's own weights sample again, as `version`."""
        self.runtime.drop_adapter()
        self._weights_changed(version)

    def _weights_changed(self, version: int) -> None:
        """The cached prompt was computed with the old weights: drop it."""
        self._cached = []
        if self.runtime.ctx is not None:
            self.runtime.clear()
        self.version = version

    def close(self) -> None:
        """Once the group in flight, if any, has ended (the interrupt ends it at its next step): a stopping run closes
        the policy while a worker thread may still be sampling."""
        self._interrupt.set()
        with self.runtime.held():
            self.grammars.close()
            self.runtime.close()


def end_of_turn_ids(model_dir: Path, tokenizer: Any) -> set[int]:
    """The tokens that end a completion, as the transformers policy takes them: the generation config's EOS
    ids (a chat model ends its turn with one, e.g. Qwen's <|im_end|>) and the tokenizer's EOS."""
    import json

    ids: list[Any] = [tokenizer.eos_token_id]
    config = model_dir / "generation_config.json"
    if config.is_file():
        eos = json.loads(config.read_text()).get("eos_token_id")
        ids += eos if isinstance(eos, list) else [eos]
    return {int(i) for i in ids if i is not None}
