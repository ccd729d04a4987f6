"""Seconds per group and tokens per second of the embedded policy, per plan, on the same real prompt.

One group = one prompt (the real first prompt of a problem: its seed as parent and as two inspirations) and
G completions; its throughput is the tokens sampled over the group's wall time, the prompt's decode included.
Plans: `llama` samples with llama.cpp on the embedded GGUF, the G rows decoded in one batch (the default where
llama-cpp-python is installed); `llama-gN` the same with a group of N; `twin` is transformers, the prompt
prefilled once in float32 and decoded in bfloat16 (the default without llama.cpp, and the baseline);
`bf16` prefills once in bfloat16; `bf16-batched` is what generate() does untouched (the prompt run G times);
`fp32` loads the model in float32. A llama plan also samples a second group whose prompt shares the first
one's opening (the problem's text; another parent's scores): `cached` is that group's throughput, with the
shared part of the prompt taken from the cache.

The last line compares the default plan (`llama` where it imports, else `twin`) with `twin`:
`policy_speed baseline_tok_s=... default_tok_s=... ratio=...`. Run it on a quiet machine.

Usage: python -m benchmarks.policy_speed [--model embedded] [--problem problems/roman_numerals] [--g 4]
       [--max-new-tokens 256] [--plans twin,llama,llama-g8]
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import torch
from rich.console import Console
from rich.table import Table

from evolve.problem import load_problem
from evolve.prompts.builder import PromptInputs, build_prompt
from policies.base import SamplingParams
from policies.prefill import PromptPrefill
from policies.transformers_policy import TransformersPolicy


def _prompt(problem_dir: str, score: float = 0.5) -> str:
    problem = load_problem(problem_dir)
    scores = {name: score for name in problem.component_names}
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


def _llama_plan(plan: str, args: argparse.Namespace, table: Table) -> float:
    """One cold group (the whole prompt decoded) and one whose prompt opening is cached; the cold throughput."""
    from policies.llama_policy import LlamaPolicy

    g = int(plan.partition("-g")[2] or args.g)
    policy = LlamaPolicy.load(args.model)
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=args.max_new_tokens, seed=1)
    rates = []
    for label, score in (("", 0.5), (" cached", 0.25)):
        ids = policy.tokenizer(policy.render(_prompt(args.problem, score)), add_special_tokens=False).input_ids
        start = time.perf_counter()
        group = policy.generate_ids(ids, params, g)
        group_s = time.perf_counter() - start
        tokens = sum(len(c.token_ids or []) for c in group)
        decoded = policy.progress.prompt_tokens
        rates.append(tokens / group_s)
        table.add_row(
            f"{plan}{label} (G={g})",
            f"{len(ids)} ({decoded} decoded)",
            "-",
            f"{group_s:.1f}",
            str(tokens),
            f"{rates[-1]:.1f}",
        )
    policy.close()
    return rates[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--problem", default="problems/roman_numerals")
    ap.add_argument("--g", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--plans", default="twin,llama,llama-g8")
    args = ap.parse_args()
    text = _prompt(args.problem)
    table = Table("plan", "prompt tokens", "prefill s", "group s", "sampled tokens", "tok/s (group)")
    summary, rates = [], {}
    for plan in args.plans.split(","):
        if plan.startswith("llama"):
            rates[plan] = _llama_plan(plan, args, table)
            summary.append(f"{plan}_tok_s={rates[plan]:.1f}")
            continue
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
        rates[plan] = tokens / group_s
        summary.append(f"{plan}_tok_s={rates[plan]:.1f}")
        del policy
    Console().print(table)
    print("plans " + " ".join(summary))
    default = "llama" if importlib.util.find_spec("llama_cpp") is not None else "twin"
    if "twin" in rates and default in rates:
        baseline, chosen = rates["twin"], rates[default]
        print(f"policy_speed baseline_tok_s={baseline:.1f} default_tok_s={chosen:.1f} ratio={chosen / baseline:.2f}")


if __name__ == "__main__":
    main()
