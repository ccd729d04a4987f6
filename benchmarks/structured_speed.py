"""A policy sampling free text beside the same policy held to the answer's grammar, on real prompts: llama.cpp
(its grammar engine), or with `--backend transformers` the transformers policy (the pure-Python matcher of
`policies.answer_matcher`).

Per prompt (`benchmarks.group_prompts.group_asks`: a problem's first groups, `problem:diff` for SEARCH/REPLACE
edits), one group sampled plain and one held to the grammar (`SamplingParams.structured`), same seed, same stop
string as the engine's. With llama.cpp the prompt is decoded once before either is timed, so both time decoding
and sampling only, which is all the grammar touches; the transformers policy keeps no prompt cache, so each of
its groups pays the prompt's pass, plain and held alike. Each completion is parsed as the engine parses it
(`evolve.prompts.parse_completion`): a variant is parseable unless it is a `parse_error`; `ok` is a child that
applied and changed the code.

The grammar's own cost is reported two ways: what it cost per token as sampled (judging the warped
distribution's candidates, the rare full mask, advancing the state), and what a full mask of the vocabulary
would cost per token, timed by replaying the first tokens of one completion per group through a fresh state.

Tokens per second are wall time and swing with the machine's other load (a group takes minutes); the CPU time
this process spent per token (llama.cpp's threads included; waiting threads sleep) is reported beside them as
the measure of work that other load does not change.

The last line (before issue 58 it opened `structured`): `structured_speed plain_tok_s=... grammar_tok_s=... ratio=...
plain_cpu_ms_per_token=...
grammar_cpu_ms_per_token=... plain_parseable=...% grammar_parseable=...% plain_ok=...% grammar_ok=...%
grammar_ms_per_token=... candidates_per_token=... full_mask_ms_per_token=... full_masks=N/T ...`.
Run by `python -m benchmarks.policy_speed --structured PROBLEMS`, or alone:
`python -m benchmarks.structured_speed [--problems problems/roman_numerals,...] [--groups 1] [--g 4]
[--backend llama|transformers]`.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from benchmarks.group_prompts import VARIANTS, GroupAsk, group_asks
from evolve.prompts import completion_stop, parse_completion
from policies.answer_grammar import AnswerShape, answer_gbnf
from policies.held_rows import HeldRow, HeldVocab
from policies.llama_grammar import RowGrammar
from policies.llama_policy import LlamaPolicy
from policies.policy import SamplingParams, chat_token_ids
from policies.transformers_policy import TransformersPolicy

KIND = "speed"
SMOKE_ARGS = (  # a run of seconds (python -m benchmarks --smoke): a tiny model on transformers' matcher
    "--backend", "transformers", "--model", "{tiny_model}", "--problems", "problems/roman_numerals",
    "--g", "1", "--max-new-tokens", "8",
)  # fmt: skip

DEFAULT_PROBLEMS = "problems/roman_numerals,problems/roman_numerals_c,problems/bin_packing:diff"
REPLAYED_TOKENS = 40  # tokens of one completion per group replayed under full masks


@dataclass
class Mode:
    """One sampler's totals over the prompts."""

    tokens: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's CPU time, llama.cpp's threads included: robust to other load
    statuses: Counter[str] = field(default_factory=Counter)
    finishes: Counter[str] = field(default_factory=Counter)

    @property
    def cpu_ms_per_token(self) -> float:
        return 1000 * self.cpu_seconds / max(self.tokens, 1)

    def share(self, *statuses: str, invert: bool = False) -> float:
        total = sum(self.statuses.values())
        hits = sum(n for s, n in self.statuses.items() if (s in statuses) != invert)
        return 100.0 * hits / max(total, 1)


def _asks(problems: str, groups: int) -> list[tuple[str, GroupAsk]]:
    out = []
    for spec in problems.split(","):
        folder, _, edit_format = spec.partition(":")
        name = os.path.basename(folder.rstrip("/")) + (f":{edit_format}" if edit_format else "")
        out += [(name, ask) for ask in group_asks(folder, groups, edit_format or "full")]
    return out


def _fresh_row(policy: LlamaPolicy | TransformersPolicy, shape: AnswerShape) -> tuple[RowGrammar | HeldRow, int]:
    """A row at the start of `shape`'s answer, with no whole-vocabulary mask remembered; the vocabulary's size."""
    if isinstance(policy, LlamaPolicy):
        return policy.grammars.row(answer_gbnf(shape)), policy.runtime.n_vocab
    vocab = policy.held_vocab(shape).vocab
    return HeldVocab(shape, vocab).row(), len(vocab.texts)


def full_mask_seconds(
    policy: LlamaPolicy | TransformersPolicy, shape: AnswerShape, token_ids: list[int]
) -> tuple[float, int]:
    """Seconds spent masking the whole vocabulary before each of `token_ids` (replayed), and how many masks."""
    row, n_vocab = _fresh_row(policy, shape)
    every = np.arange(n_vocab)
    start = time.perf_counter()
    masks = 0
    try:
        for token in token_ids:
            if not row.allowed(every)[token]:
                break
            masks += 1
            row.accept(token)
    finally:
        row.close()
    return time.perf_counter() - start, masks


def compare(model: str, problems: str, groups: int, g: int, max_new_tokens: int, backend: str = "llama") -> str:
    """Sample each ask both ways; print a line per group and return the summary line."""
    policy = LlamaPolicy.load(model) if backend == "llama" else TransformersPolicy.load(model)
    modes = {"plain": Mode(), "grammar": Mode()}
    mask_s, masks = 0.0, 0
    for k, (name, ask) in enumerate(_asks(problems, groups)):
        ids = chat_token_ids(policy.tokenizer, ask.prompt)
        if isinstance(policy, LlamaPolicy):
            policy.generate_ids(ids, SamplingParams(0.8, 0.95, 1, seed=0), 1)  # the prompt decoded, not timed
        shape = AnswerShape(VARIANTS, ask.edit_format, ask.fence_tag)
        for mode_name, structured in (("plain", None), ("grammar", shape)):
            stop = completion_stop(VARIANTS)
            params = SamplingParams(0.8, 0.95, max_new_tokens, k + 1, stop=stop, structured=structured)
            start, cpu = time.perf_counter(), time.process_time()
            group = policy.generate_ids(ids, params, g)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            mode = modes[mode_name]
            mode.cpu_seconds += cpu
            tokens = sum(len(c.token_ids or []) for c in group)
            parsed = [parse_completion(ask.parent, c.text, VARIANTS, multi_file=ask.multi_file) for c in group]
            statuses = Counter(v.status for variants in parsed for v in variants)
            mode.tokens, mode.seconds = mode.tokens + tokens, mode.seconds + seconds
            mode.statuses.update(statuses)
            mode.finishes.update(c.finish_reason or "?" for c in group)
            print(
                f"{name} group {k + 1} {mode_name}: {tokens} tokens, {seconds:.1f} s, {tokens / seconds:.1f} tok/s, "
                f"{1000 * cpu / max(tokens, 1):.0f} CPU ms/token, "
                f"variants {dict(statuses)}, ends {dict(Counter(c.finish_reason for c in group))} ({_load()})",
                flush=True,
            )
            if structured is not None:
                spent, n = full_mask_seconds(policy, shape, group[0].token_ids[:REPLAYED_TOKENS])
                mask_s, masks = mask_s + spent, masks + n
    cost, vocab = policy.grammar_cost, _fresh_row(policy, AnswerShape(1, "full"))[1]
    policy.close()
    plain, held = modes["plain"], modes["grammar"]
    plain_rate, held_rate = plain.tokens / plain.seconds, held.tokens / held.seconds
    nucleus = (cost.candidates - cost.full_masks * vocab) / max(cost.checks - cost.full_masks, 1)
    return (
        f"structured_speed plain_tok_s={plain_rate:.1f} grammar_tok_s={held_rate:.1f} "
        f"ratio={held_rate / plain_rate:.2f} "
        f"plain_cpu_ms_per_token={plain.cpu_ms_per_token:.0f} grammar_cpu_ms_per_token={held.cpu_ms_per_token:.0f} "
        f"plain_parseable={plain.share('parse_error', invert=True):.0f}% "
        f"grammar_parseable={held.share('parse_error', invert=True):.0f}% "
        f"plain_ok={plain.share('ok'):.0f}% grammar_ok={held.share('ok'):.0f}% "
        f"grammar_ms_per_token={1000 * cost.seconds / max(held.tokens, 1):.2f} "
        f"candidates_per_token={nucleus:.0f} "
        f"full_mask_ms_per_token={1000 * mask_s / max(masks, 1):.1f} full_masks={cost.full_masks}/{held.tokens} "
        f"ends_plain={dict(plain.finishes)} ends_grammar={dict(held.finishes)}"
    )


def _load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--problems", default=DEFAULT_PROBLEMS, help="comma-separated; problem:diff asks for edits")
    ap.add_argument("--groups", type=int, default=1, help="groups per problem")
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=300)
    ap.add_argument("--backend", choices=("llama", "transformers"), default="llama")
    args = ap.parse_args()
    print(compare(args.model, args.problems, args.groups, args.g, args.max_new_tokens, args.backend))


if __name__ == "__main__":
    main()
