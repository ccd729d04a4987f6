"""Group throughput of the embedded policy, per plan, over the same consecutive groups of one run.

A run samples group after group, each on another parent of the same problem (`benchmarks.group_prompts`: the
seed first, then children of it). A group's throughput is the tokens it sampled over its wall time, the
prompt's decode included. Per plan: the first group (cold: the whole prompt decoded) and the steady state (the
later groups together: a plan with a prompt cache decodes only the prompt's part from the parent on, the
problem's text and the ask's rules being cached since the first group).

Plans: `llama` samples with llama.cpp on the embedded GGUF, the G rows decoded in one batch (the default where
llama-cpp-python is installed); `llama-gN` the same with a group of N; `twin` is transformers, the prompt
prefilled once in float32 and decoded in bfloat16 (the default without llama.cpp, and the baseline);
`bf16` prefills once in bfloat16; `bf16-batched` is what generate() does untouched (the prompt run G times);
`fp32` loads the model in float32. A transformers plan keeps no prompt cache between groups; its float32 twin
is made before the first group is timed.

The plans' last line compares the default plan (`llama` where it imports, else `twin`) with `twin`, both in the
steady state: `policy_speed baseline_tok_s=... default_tok_s=... ratio=...` (without both plans, the plans'
own rates: `policy_speed twin_first_tok_s=... ...`). Run it on a quiet machine. `--model DIR` samples another
model (the smoke run's tiny one, `--plans twin`).

`--structured PROBLEMS` then samples llama.cpp's plain sampler beside the same sampler held to the answer's
grammar, on the first group of each problem (`benchmarks.structured_speed`), and ends with its own line:
`structured_speed plain_tok_s=... grammar_tok_s=... ratio=... plain_parseable=...% grammar_parseable=...% ...`.
`--plans ""` runs that comparison alone.

Usage: python -m benchmarks.policy_speed [--model embedded] [--problem problems/roman_numerals] [--g 4]
       [--groups 4] [--max-new-tokens 256] [--plans twin,llama,llama-g8] [--structured default|PROBLEMS]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from dataclasses import dataclass

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.group_prompts import group_prompts
from policies.policy import SamplingParams, chat_token_ids
from policies.prefill import PromptPrefill
from policies.transformers_policy import TransformersPolicy

KIND = "speed"
SMOKE_ARGS = (  # a run of seconds (python -m benchmarks --smoke): a tiny model, the transformers plan
    "--model", "{tiny_model}", "--plans", "twin", "--groups", "2", "--g", "2", "--max-new-tokens", "8",
)  # fmt: skip


def _policy(model: str, plan: str) -> TransformersPolicy:
    policy = TransformersPolicy.load(model)
    if plan == "fp32":
        policy.model = policy.model.float()
        policy.prefill = PromptPrefill(use_float32_twin=False)
    elif plan in ("bf16", "bf16-batched"):
        policy.model = policy.model.to(torch.bfloat16)
        policy.prefill = PromptPrefill(use_float32_twin=False)
    else:
        policy.model = policy.model.to(torch.bfloat16)
        policy.prefill = PromptPrefill(use_float32_twin=True)
    return policy


@dataclass
class GroupTime:
    prompt_tokens: int
    decoded: int  # prompt tokens decoded for this group (the rest came from the cache)
    seconds: float
    tokens: int


def _llama_groups(plan: str, args: argparse.Namespace, prompts: list[str]) -> list[GroupTime]:
    from policies.llama_policy import LlamaPolicy

    g = int(plan.partition("-g")[2] or args.g)
    policy = LlamaPolicy.load(args.model)
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=args.max_new_tokens, seed=1)
    times = []
    for text in prompts:
        ids = chat_token_ids(policy.tokenizer, text)
        start = time.perf_counter()
        group = policy.generate_ids(ids, params, g)
        seconds = time.perf_counter() - start
        times.append(GroupTime(len(ids), policy.progress.prompt_tokens, seconds, _sampled(group)))
        _say(plan, times[-1])
    policy.close()
    return times


def _transformers_groups(plan: str, args: argparse.Namespace, prompts: list[str]) -> list[GroupTime]:
    policy = _policy(args.model, plan)
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=args.max_new_tokens, seed=1)
    if plan == "bf16-batched":  # no cache handed over: generate() runs the prompt once per sequence
        policy.prefill.cache = lambda *a, **k: None  # type: ignore[method-assign]
    else:  # the float32 twin is copied once per weights version, not per group: not timed
        policy.prefill.cache(policy.model, policy.version, chat_token_ids(policy.tokenizer, prompts[0])[:8], 1)
    times = []
    for text in prompts:
        ids = chat_token_ids(policy.tokenizer, text)
        start = time.perf_counter()  # the group's time includes its own prefill
        group = policy.generate_ids(ids, params, args.g)
        seconds = time.perf_counter() - start
        times.append(GroupTime(len(ids), len(ids), seconds, _sampled(group)))
        _say(plan, times[-1])
    del policy
    return times


def _say(plan: str, t: GroupTime) -> None:
    """One line per group as it ends: a slow plan on a busy machine takes many minutes."""
    print(
        f"{plan}: {t.prompt_tokens} prompt tokens ({t.decoded} decoded), {t.seconds:.1f} s, {t.tokens} tokens, "
        f"{t.tokens / t.seconds:.1f} tok/s ({_load()})",
        flush=True,
    )


def _sampled(group: list) -> int:
    return sum(len(c.token_ids or []) for c in group)


def _rate(times: list[GroupTime]) -> float:
    return sum(t.tokens for t in times) / sum(t.seconds for t in times)


def _load() -> str:
    return "load " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--problem", default="problems/roman_numerals")
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--groups", type=int, default=4, help="consecutive groups per plan (the first is cold)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--plans", default="twin,llama,llama-g8")
    ap.add_argument(
        "--structured",
        default="",
        help="comma-separated problems (problem:diff for edits), or 'default': also compare the plain and the "
        "grammar-held llama sampler on their first groups",
    )
    args = ap.parse_args()
    if args.groups < 2:
        ap.error("--groups must be at least 2: one cold group and at least one in the steady state")
    if args.plans:
        _plans(args)
    if args.structured:
        from benchmarks.structured_speed import DEFAULT_PROBLEMS, compare

        problems = DEFAULT_PROBLEMS if args.structured == "default" else args.structured
        print(compare(args.model, problems, 1, args.g, args.max_new_tokens))


def _plans(args: argparse.Namespace) -> None:
    prompts = group_prompts(args.problem, args.groups)
    table = Table("plan", "group", "prompt tokens", "decoded", "group s", "sampled tokens", "tok/s", "load after")
    summary, steady = [], {}
    for plan in args.plans.split(","):
        groups = (_llama_groups if plan.startswith("llama") else _transformers_groups)(plan, args, prompts)
        for k, t in enumerate(groups, 1):
            row = (
                str(t.prompt_tokens),
                str(t.decoded),
                f"{t.seconds:.1f}",
                str(t.tokens),
                f"{t.tokens / t.seconds:.1f}",
            )
            table.add_row(plan, str(k), *row, _load() if k == len(groups) else "")
        steady[plan] = _rate(groups[1:])
        summary.append(f"{plan}_first_tok_s={_rate(groups[:1]):.1f} {plan}_steady_tok_s={steady[plan]:.1f}")
        print(f"{plan}: first group {_rate(groups[:1]):.1f} tok/s, steady state {steady[plan]:.1f} tok/s ({_load()})")
    Console().print(table)
    print("plans " + " ".join(summary))
    default = "llama" if importlib.util.find_spec("llama_cpp") is not None else "twin"
    if "twin" in steady and default in steady:
        baseline, chosen = steady["twin"], steady[default]
        print(f"policy_speed baseline_tok_s={baseline:.1f} default_tok_s={chosen:.1f} ratio={chosen / baseline:.2f}")
    else:  # no baseline among the plans run (the smoke run's twin alone): the plans' own rates
        print("policy_speed " + " ".join(summary))


if __name__ == "__main__":
    main()
