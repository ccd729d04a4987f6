"""VPO vs GRPO vs Multi-RLVR on a synthetic task whose reward components truly trade off.

The task (fixed before any run): the model writes answers of exactly 8 characters over {a, b, c, x}. An
answer's reward vector is (share of 'a', share of 'b', share of 'c'): every 'a' costs a 'b' or a 'c', so the
three components trade off exactly, and 'x' is waste. A malformed or repeated answer is a zero row. Under a
random scalarisation w the best possible single answer is the corner of the largest weight, so a pool that
covers several corners does better than a pool of one composition. Held-out scalarisations are fresh
Dirichlet(1) draws; best@k is the mean over them of the best w·r among the first k answers of a pool.

Every method starts from the same briefly fine-tuned tiny model (random compositions, right format), then
runs the same number of updates on the same number of completions with this project's own LoRA trainer:
VPO with m=3 answers per completion, GRPO with m=1 (the mean reward), Multi-RLVR with m=3 (the best answer
under one fixed, uniform scalarisation). A VPO completion holds three answers, so it trains on about three
times the tokens of a GRPO completion per update; the arm `grpo-eqtok` gives GRPO three times the groups per
update, so that both train on the same number of tokens, and the table reports tokens per update for every arm.
Diversity is the mean pairwise distance between the *valid* answers of a pool (malformed or repeated answers
are zero rows, and counting them as points at the origin would reward the method that wastes more answers).
Ends with `vpo_vs_grpo k1 vpo=... grpo=... mrlvr=... k27 ... div ...` (mean±sd over seeds).
Usage: python -m benchmarks.vpo_vs_grpo [--seeds 3] [--steps 150] [--no-equal-tokens] [--teach-steps 400] [--pools 12]
"""

from __future__ import annotations

import argparse
import random
import time

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from policies.policy import SamplingParams
from policies.tiny import teach, tiny_model, tiny_tokenizer
from policies.trainer import PolicyTrainer, TrainConfig
from policies.training_groups import TrainingCompletion, TrainingGroup
from policies.transformers_policy import TransformersPolicy

KIND = "experiment"
SMOKE_ARGS = (  # a run of seconds (python -m benchmarks --smoke)
    "--seeds", "1", "--steps", "1", "--groups", "1", "--group-size", "2",
    "--no-equal-tokens", "--teach-steps", "2", "--pools", "1",
)  # fmt: skip

ALPHABET, LENGTH, DIM = "abcx", 8, 3
METHODS = {"vpo": 3, "grpo": 1, "multi-rlvr": 3}  # method -> answers per completion (m)
EQUAL_TOKENS_ARM = "grpo-eqtok"  # GRPO with max(m) / m times the groups per update
KS = (1, 3, 9, 27)


def prompt_for(m: int) -> str:
    return f"Write {m} answer{'s' if m > 1 else ''}:\n"


def parse(text: str, m: int) -> np.ndarray:
    """(m, 3) reward rows; malformed, missing or repeated answers are zero rows."""
    rows = np.zeros((m, DIM))
    seen: set[str] = set()
    for k, answer in enumerate(text.strip().split("|")[:m]):
        if len(answer) == LENGTH and set(answer) <= set(ALPHABET) and answer not in seen:
            rows[k] = [answer.count(ch) / LENGTH for ch in "abc"]
        seen.add(answer)
    return rows


# The start's teaching steps and the pools measured per arm: module settings that `--teach-steps` and `--pools`
# change for one run (the smoke run's few), read where they are used.
SIZES = {"teach_steps": 400, "pools": 12}


def initial_model(seed: int) -> tuple[object, object]:
    """The shared start: a tiny model taught the format on random compositions."""
    rng = random.Random(seed)
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=seed, hidden=64)
    pairs = []
    for _ in range(96):
        m = rng.choice((1, 3))
        answers = ["".join(rng.choice(ALPHABET) for _ in range(LENGTH)) for _ in range(m)]
        pairs.append((prompt_for(m), "|".join(answers)))
    teach(model, tok, pairs, steps=SIZES["teach_steps"], lr=3e-3)
    return tok, model


def sample_answers(policy: TransformersPolicy, m: int, total: int, seed: int) -> np.ndarray:
    completions = policy.generate(prompt_for(m), SamplingParams(1.0, 1.0, 9 * m - 1, seed), total // m)
    return np.concatenate([parse(c.text, m) for c in completions])  # (total, 3)


def best_at_k(pools: list[np.ndarray], weights: np.ndarray) -> dict[int, float]:
    out = {}
    for k in KS:
        out[k] = float(np.mean([(pool[:k] @ weights.T).max(axis=0).mean() for pool in pools]))
    return out


def diversity(pools: list[np.ndarray]) -> float:
    """Mean pairwise distance between the valid (non-zero) answers of each pool, averaged over pools."""
    values = []
    for pool in pools:
        valid = pool[pool.sum(axis=1) > 0]
        if len(valid) >= 2:
            d = np.sqrt(((valid[:, None] - valid[None]) ** 2).sum(-1))
            values.append(d.sum() / (len(valid) * (len(valid) - 1)))
    return float(np.mean(values)) if values else 0.0


def run_one(arm: str, seed: int, steps: int, groups: int, group_size: int, start: dict) -> dict:
    torch.manual_seed(seed)
    tok, model = initial_model(seed) if start.get(seed) is None else start[seed]()
    method = "grpo" if arm == EQUAL_TOKENS_ARM else arm
    m = METHODS[method]
    if arm == EQUAL_TOKENS_ARM:
        groups *= max(METHODS.values()) // m
    policy = TransformersPolicy(model, tok, "tiny")
    trainer = PolicyTrainer(
        model, tok, policy.render, TrainConfig(method=method, learning_rate=2e-3, lora_rank=8, lora_alpha=16, seed=seed)
    )
    policy.model = trainer.model
    tokens = []
    for step in range(steps):
        batch = []
        for g in range(groups):
            sampled = policy.generate(
                prompt_for(m), SamplingParams(1.0, 1.0, 9 * m - 1, seed * 10_000 + step * 100 + g), group_size
            )
            batch.append(
                TrainingGroup(
                    g,
                    prompt_for(m),
                    [
                        TrainingCompletion(i, c.token_ids, c.logprobs, 1.0, parse(c.text, m))
                        for i, c in enumerate(sampled)
                    ],
                )
            )
        tokens.append(trainer.update(batch).tokens)
    held_out = np.random.default_rng(10_000 + seed).dirichlet(np.ones(DIM), size=500)
    pools = [sample_answers(policy, m, 27, 777 + seed * 100 + p) for p in range(SIZES["pools"])]
    valid = float(np.mean([(pool.sum(axis=1) > 0).mean() for pool in pools]))
    return {"best": best_at_k(pools, held_out), "div": diversity(pools), "valid": valid, "tokens": np.mean(tokens)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--groups", type=int, default=4, help="prompts (groups) per update")
    ap.add_argument("--group-size", type=int, default=8, help="completions per group (G)")
    ap.add_argument("--no-equal-tokens", action="store_true", help=f"leave out the {EQUAL_TOKENS_ARM} arm")
    ap.add_argument("--teach-steps", type=int, default=SIZES["teach_steps"], help="teaching the shared start")
    ap.add_argument("--pools", type=int, default=SIZES["pools"], help="pools of 27 answers measured per arm")
    args = ap.parse_args()
    SIZES.update(teach_steps=args.teach_steps, pools=args.pools)
    arms = [*METHODS] + ([] if args.no_equal_tokens else [EQUAL_TOKENS_ARM])
    torch.set_num_threads(2)
    started = time.time()
    results: dict[str, list[dict]] = {"start (m=3)": [], **{a: [] for a in arms}}
    for seed in range(args.seeds):
        snapshot = initial_model(seed)
        state = {k: v.clone() for k, v in snapshot[1].state_dict().items()}

        def fresh(seed: int = seed, state: dict = state) -> tuple[object, object]:
            tok = tiny_tokenizer()
            model = tiny_model(tok, seed=seed, hidden=64)
            model.load_state_dict(state)
            return tok, model

        base_pools = [
            sample_answers(TransformersPolicy(fresh()[1], snapshot[0], "tiny"), 3, 27, 5 + p)
            for p in range(SIZES["pools"])
        ]
        results.setdefault("start (m=3)", []).append(
            {
                "best": best_at_k(base_pools, np.random.default_rng(10_000 + seed).dirichlet(np.ones(DIM), size=500)),
                "div": diversity(base_pools),
                "valid": float(np.mean([(p.sum(1) > 0).mean() for p in base_pools])),
                "tokens": 0.0,
            }
        )
        for arm in arms:
            results[arm].append(run_one(arm, seed, args.steps, args.groups, args.group_size, {seed: fresh}))
            print(f"seed {seed} {arm}: {results[arm][-1]} ({time.time() - started:.0f}s)", flush=True)
    table = Table(
        title=f"best@k under held-out random scalarisations ({args.seeds} seeds, {args.steps} updates of "
        f"{args.groups}x{args.group_size} completions)"
    )
    for col in ("method", *(f"best@{k}" for k in KS), "diversity (valid)", "valid answers", "tokens/update"):
        table.add_column(col, justify="right" if col != "method" else "left")

    def cell(rows: list[dict], key) -> str:
        vals = [r["best"][key] if isinstance(key, int) else r[key] for r in rows]
        return f"{np.mean(vals):.3f}±{np.std(vals):.3f}"

    for name, rows in results.items():
        table.add_row(name, *(cell(rows, k) for k in KS), cell(rows, "div"), cell(rows, "valid"), cell(rows, "tokens"))
    Console(width=160).print(table)
    print(f"elapsed {time.time() - started:.0f}s")
    short = {"vpo": "vpo", "grpo": "grpo", "multi-rlvr": "mrlvr", EQUAL_TOKENS_ARM: "grpo_eqtok"}

    def figures(key) -> str:
        parts = []
        for arm in arms:
            vals = [r["best"][key] if isinstance(key, int) else r[key] for r in results[arm]]
            parts.append(f"{short[arm]}={np.mean(vals):.3f}±{np.std(vals):.3f}")
        return " ".join(parts)

    print(f"vpo_vs_grpo k1 {figures(1)} k27 {figures(27)} div {figures('div')}")


if __name__ == "__main__":
    main()
