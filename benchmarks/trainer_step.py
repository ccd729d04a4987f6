"""Time of one policy update: this project's trainer against TRL's GRPOTrainer, same tiny model and batch.

Both train the same LoRA (rank 16, all linear projections) of a tiny Qwen2 (h128, 2 layers) in fp32 on the
CPU, on one group of 8 completions of 256 tokens after a 64-token prompt, one optimizer step, no KL. TRL's
step includes generating its completions, so the time it spends in `_generate_and_score_completions` is
measured and taken off. Needs the `bench` extra (trl). Usage: python -m benchmarks.trainer_step [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from policies.groups import TrainingCompletion, TrainingGroup
from policies.tiny import tiny_model, tiny_tokenizer
from policies.trainer import PolicyTrainer, TrainConfig

G, PROMPT_TOKENS, COMPLETION_TOKENS, RANK, LR = 8, 64, 256, 16, 1e-4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def ours(repeats: int) -> list[float]:
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    trainer = PolicyTrainer(
        model,
        tok,
        lambda p: p,
        TrainConfig(method="grpo", learning_rate=LR, lora_rank=RANK, lora_alpha=2 * RANK, minibatch=G),
    )
    rng = np.random.default_rng(0)
    prompt = "p" * PROMPT_TOKENS  # one byte-level token per character
    times = []
    for r in range(repeats + 1):
        completions = [
            TrainingCompletion(
                i,
                [int(t) for t in rng.integers(0, 256, COMPLETION_TOKENS)],
                [-1.0] * COMPLETION_TOKENS,
                1.0,
                np.array([[float(rng.random())]]),
            )
            for i in range(G)
        ]
        start = time.perf_counter()
        stats = trainer.update([TrainingGroup(r, prompt, completions)])
        if r:  # the first is warm-up
            times.append(time.perf_counter() - start)
        assert stats.samples == G and stats.tokens == G * COMPLETION_TOKENS
    return times


def trl(repeats: int) -> list[float]:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0)
    generation: list[float] = []
    steps: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            self.t = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            steps.append(time.perf_counter() - self.t)

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=G,
        num_generations=G,
        max_completion_length=COMPLETION_TOKENS,
        learning_rate=LR,
        beta=0.0,
        loss_type="dapo",
        max_steps=repeats + 1,
        logging_steps=1000,
        report_to="none",
        use_cpu=True,
        bf16=False,
        save_strategy="no",
        generation_kwargs={"min_new_tokens": COMPLETION_TOKENS},
        gradient_accumulation_steps=1,
        steps_per_generation=1,
    )
    data = Dataset.from_dict({"prompt": ["p" * PROMPT_TOKENS] * (G * (repeats + 2))})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[lambda completions, **kw: [float(len(c) % 7) for c in completions]],
        args=config,
        train_dataset=data,
        processing_class=tok,
        peft_config=LoraConfig(r=RANK, lora_alpha=2 * RANK, target_modules=TARGETS, task_type="CAUSAL_LM"),
        callbacks=[Timer()],
    )
    original = trainer._generate_and_score_completions

    def timed(*args, **kwargs):
        start = time.perf_counter()
        out = original(*args, **kwargs)
        generation.append(time.perf_counter() - start)
        return out

    trainer._generate_and_score_completions = timed
    trainer.train()
    return [s - g for s, g in zip(steps[1:], generation[1:], strict=False)]


def embedded(repeats: int) -> None:
    """One update of the embedded 0.5B model (bf16) on 8 x 256 completion tokens: seconds and peak memory."""
    import resource

    from evolve.problem import load_problem
    from evolve.prompts import PromptInputs, build_prompt
    from policies.transformers_policy import TransformersPolicy

    policy = TransformersPolicy.load("embedded")
    problem = load_problem(Path(__file__).resolve().parents[1] / "problems" / "circle_packing")
    prompt = build_prompt(
        PromptInputs(problem.config.description, problem.seed_code, {"n26": 2.1}, None, [], 3, "full")
    )
    trainer = PolicyTrainer(
        policy.model,
        policy.tokenizer,
        policy.render,
        TrainConfig(method="vpo", lora_rank=RANK, lora_alpha=2 * RANK, minibatch=G),
    )
    rng = np.random.default_rng(0)
    prompt_tokens = len(policy.tokenizer(policy.render(prompt)).input_ids)
    times = []
    for r in range(repeats):
        completions = [
            TrainingCompletion(
                i,
                [int(t) for t in rng.integers(100, 20000, COMPLETION_TOKENS)],
                [-1.0] * COMPLETION_TOKENS,
                0.8,
                rng.random((3, 5)),
            )
            for i in range(G)
        ]
        start = time.perf_counter()
        trainer.update([TrainingGroup(r, prompt, completions)])
        times.append(time.perf_counter() - start)
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        f"embedded_update median_s={statistics.median(times):.1f} runs={len(times)} peak_rss_gib={peak_gib:.1f} "
        f"prompt_tokens={prompt_tokens} completion_tokens={G}x{COMPLETION_TOKENS} device={trainer.device}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--embedded", action="store_true", help="time our update on the embedded 0.5B model instead")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.embedded:
        embedded(args.repeats)
        return
    mine = ours(args.repeats)
    theirs = trl(args.repeats)
    table = Table(title=f"one update: {G} completions x {COMPLETION_TOKENS} tokens, LoRA r{RANK}, tiny Qwen2, CPU")
    for col in ("trainer", "median s", "runs"):
        table.add_column(col, justify="right" if col != "trainer" else "left")
    table.add_row("vpo-evolve PolicyTrainer", f"{statistics.median(mine):.3f}", str(len(mine)))
    table.add_row("TRL GRPOTrainer (generation excluded)", f"{statistics.median(theirs):.3f}", str(len(theirs)))
    Console(width=120).print(table)
    ratio = statistics.median(mine) / statistics.median(theirs)
    print(f"trainer_step ours_s={statistics.median(mine):.3f} trl_s={statistics.median(theirs):.3f} ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
