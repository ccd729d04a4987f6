"""Seconds per group and tokens per second of the transformers policy, per precision plan.

One group = one prompt (the real first prompt of a problem: its seed as parent and as two inspirations) and
G completions. Plans: `twin` prefills the prompt once in float32 and decodes in bfloat16 (the default on a CPU
without native bf16); `bf16` prefills once in bfloat16; `bf16-batched` is what generate() does untouched (the
prompt run G times, in bfloat16); `fp32` loads the model in float32. Run it on a quiet machine.

Usage: python -m benchmarks.policy_speed [--model embedded] [--problem problems/roman_numerals] [--g 4]
       [--max-new-tokens 256] [--plans twin,bf16,fp32]
"""

from __future__ import annotations

import argparse
import time

import torch
from rich.console import Console
from rich.table import Table

from evolve.problem import load_problem
from evolve.prompts.builder import PromptInputs, build_prompt
from policies.base import SamplingParams
from policies.prefill import PromptPrefill
from policies.transformers_policy import TransformersPolicy


def _prompt(problem_dir: str) -> str:
    problem = load_problem(problem_dir)
    scores = {name: 0.5 for name in problem.component_names}
    inspirations = [(problem.seed_code, scores), (problem.seed_code, scores)]
    return build_prompt(
        PromptInputs(problem.config.description, problem.seed_code, scores, None, inspirations, 3, "full")
    )


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--problem", default="problems/roman_numerals")
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--plans", default="twin,bf16,fp32")
    args = ap.parse_args()
    text = _prompt(args.problem)
    table = Table("plan", "prompt tokens", "prefill s", "group s", "sampled tokens", "tok/s (group)")
    summary = []
    for plan in args.plans.split(","):
        policy = _policy(args.model, plan)
        ids = policy.tokenizer(policy.render(text), add_special_tokens=False).input_ids
        params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=args.max_new_tokens, seed=1)
        prefill_s = 0.0
        if plan == "bf16-batched":  # no cache handed over: generate() runs the prompt once per sequence
            policy.prefill.cache = lambda *a, **k: None  # type: ignore[method-assign]
        else:
            policy.prefill.cache(policy.model, policy.version, ids[:-1], args.g)  # copies the twin, if any
            start = time.perf_counter()
            policy.prefill.cache(policy.model, policy.version, ids[:-1], args.g)
            prefill_s = time.perf_counter() - start
        start = time.perf_counter()  # the group's time includes its own prefill
        group = policy.generate_ids(ids, params, args.g)
        group_s = time.perf_counter() - start
        tokens = sum(len(g.token_ids or []) for g in group)
        table.add_row(plan, str(len(ids)), f"{prefill_s:.1f}", f"{group_s:.1f}", str(tokens), f"{tokens / group_s:.1f}")
        summary.append(f"{plan}_group_s={group_s:.1f}")
        del policy
    Console().print(table)
    print("policy_speed " + " ".join(summary))


if __name__ == "__main__":
    main()
