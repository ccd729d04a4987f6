"""Time of one policy update: this project's trainer against TRL's GRPOTrainer, same tiny model and batch.

Both train the same LoRA (rank 16, all linear projections) of a tiny Qwen2 (h128, 2 layers) in fp32 on the
CPU, on one group of 8 completions of 256 tokens after a 64-token prompt, one optimizer step, no KL. TRL's
step includes generating its completions, so the time it spends in `_generate_and_score_completions` is
measured and taken off. Needs the `bench` extra (trl), except with `--no-trl` (this project's trainer alone, the
smoke run's). Ends with `trainer_step ours_s=... trl_s=... ratio=...`.
Usage: python -m benchmarks.trainer_step [--repeats 3] [--no-trl]

`--embedded`: the real thing instead, one group of the embedded model and the update on it (see `embedded`),
ending with `trainer_step update_s=... sample_s=... ratio=...`.

`--per-token`: the update's cost per sampled token as the PPO epochs and the KL term grow (see `per_token`), on
the tiny model or a local model directory (`--model`), ending with one line per setting,
`trainer_step_per_token model=... epochs=E kl=K ms_per_token=...`. Run it pinned and niced where others work:
`taskset -c 0 nice -n 5 python -m benchmarks.trainer_step --per-token --model DIR`.
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

from policies.tiny import tiny_model, tiny_tokenizer
from policies.trainer import PolicyTrainer, TrainConfig
from policies.training_groups import TrainingCompletion, TrainingGroup

KIND = "speed"
SMOKE_ARGS = ("--repeats", "1", "--no-trl")

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


def embedded(policy_spec: str, group_size: int, max_new_tokens: int, groups: int) -> None:
    """Real groups and an update on each, as a run with `--train-every 1` makes them: the roman_numerals prompt,
    G completions sampled by the fast sampler (llama.cpp on the embedded GGUF), scored, then one VPO update of
    the bf16 copy on that same group, its adapter saved, exported and loaded into the sampler. The ratio is an
    update's seconds (all of that) over the seconds its group took to sample; the last line is the last group's
    (the first update also pays torch's one-time warm-up, which a run pays once)."""
    import sqlite3
    from collections import defaultdict
    from dataclasses import replace

    from benchmarks.closed_loop_arm import ArmSettings, TimedTrainer, arm_options
    from evolve.archive import Archive
    from evolve.loop import SearchLoop, run_search
    from evolve.problem import load_problem
    from evolve.runs import open_run
    from evolve.search import train_config
    from policies.from_spec import make_policy
    from sandboxes.backends import make_sandbox

    seconds: dict[str, float] = defaultdict(float)
    problem = load_problem(Path(__file__).resolve().parents[1] / "problems" / "roman_numerals")
    settings = ArmSettings(policy=policy_spec, skip_zero_advantage=False, held_out_groups=0, workers=1)
    options = replace(
        arm_options(problem, "vpo", 0, settings),
        max_groups=groups,
        group_size=group_size,
        max_new_tokens=max_new_tokens,
        fit_tokens_to_code=False,
        stop_when_solved=False,
    )
    work = Path(tempfile.mkdtemp(prefix="trainer-step-"))
    archive = Archive(work / "step.db")
    run = open_run(archive, problem, options).run
    policy = make_policy(policy_spec)
    sandbox = make_sandbox("process", workers=1)
    config = replace(  # versions_back=0: each update learns from the group just sampled, and from it alone
        train_config(options), lora_rank=settings.lora_rank, lora_alpha=2 * settings.lora_rank, versions_back=0
    )
    trainer = TimedTrainer(
        archive, run.id, list(problem.components), options.variants, policy, config, work / "adapters", seconds=seconds
    )
    parts: list[dict[str, float]] = []

    def step(*args: object) -> object:
        before = dict(seconds)
        try:
            return trainer.step(*args)  # type: ignore[arg-type]
        finally:
            parts.append({k: seconds[k] - before.get(k, 0.0) for k in ("update_step", "save", "publish")})

    loop = SearchLoop(problem, archive, policy, sandbox, run, options, train_steps={options.members()[0].name: step})
    run_search(loop)
    con = sqlite3.connect(work / "step.db")
    sampled = con.execute("SELECT generation_s, tokens FROM prompts WHERE run_id = ? ORDER BY id", (run.id,)).fetchall()
    con.close()
    for i, (part, (sample_s, tokens)) in enumerate(zip(parts, sampled, strict=False)):
        update_s = part["update_step"]
        print(
            f"group {i + 1}: sampled {tokens} tokens in {sample_s:.1f} s; update {update_s:.1f} s (trainer step "
            f"{update_s - part['save'] - part['publish']:.1f} s, save {part['save']:.1f} s, publish to the sampler "
            f"{part['publish']:.1f} s)"
        )
    if parts:
        ratio = update_s / max(sample_s, 1e-9)
        print(f"trainer_step update_s={update_s:.1f} sample_s={sample_s:.1f} ratio={ratio:.2f}")
    archive.close()
    policy.close()
    sandbox.close()


def per_token(
    model_dir: str | None, group: int, prompt_words: int, completion_tokens: int, settings: list[str]
) -> None:
    """One update of one group of `group` completions of `completion_tokens` random tokens each (GRPO advantages
    +-1, so every completion is kept), after a prompt of `prompt_words` words, for each "EPOCHS:KL" setting, each
    from the same fresh adapter; the update's CPU seconds (this process's, so that a machine shared with other work
    still gives the update's own cost) over the tokens sampled (group x completion_tokens)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model_dir:
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
        name = Path(model_dir).name
    else:
        tok = tiny_tokenizer()
        model, name = tiny_model(tok, seed=0), "tiny"
    vocab = min(len(tok), model.config.vocab_size)
    rng = np.random.default_rng(0)
    prompt = " ".join(["improve"] * prompt_words)
    completions = [
        TrainingCompletion(
            i,
            [int(t) for t in rng.integers(0, vocab, completion_tokens)],
            [-1.0] * completion_tokens,
            1.0,
            np.array([[float(i % 2)]]),
        )
        for i in range(group)
    ]
    rows = []
    for setting in settings:
        epochs, kl = setting.split(":")
        torch.manual_seed(0)
        config = TrainConfig(
            method="grpo",
            learning_rate=LR,
            lora_rank=RANK,
            lora_alpha=2 * RANK,
            minibatch=group,
            epochs=int(epochs),
            kl_coef=float(kl),
        )
        trainer = PolicyTrainer(model, tok, lambda p: p, config)
        start, cpu = time.perf_counter(), time.process_time()
        stats = trainer.update([TrainingGroup(0, prompt, completions)])
        seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
        trainer.model.unload()  # the base weights again, without this setting's adapter, for the next
        sampled = group * completion_tokens
        rows.append((int(epochs), float(kl), seconds, 1000 * cpu_s / sampled, stats.epoch_clip_fractions))
        print(f"epochs={epochs} kl={kl}: {seconds:.1f} s wall, {cpu_s:.1f} s of CPU", flush=True)
    table = Table(title=f"one update of {group} x {completion_tokens} sampled tokens, {name}, LoRA r{RANK}, CPU")
    for col in ("epochs", "KL coef", "update s (wall)", "CPU ms / sampled token", "clip fraction by epoch"):
        table.add_column(col, justify="right")
    for epochs_n, kl_coef, seconds, ms, clips in rows:
        table.add_row(str(epochs_n), f"{kl_coef:g}", f"{seconds:.1f}", f"{ms:.1f}", " ".join(f"{c:.3f}" for c in clips))
    Console(width=120).print(table)
    for epochs_n, kl_coef, _, ms, _ in rows:
        print(f"trainer_step_per_token model={name} epochs={epochs_n} kl={kl_coef:g} cpu_ms_per_token={ms:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--embedded", action="store_true", help="one real group and update of the embedded model instead")
    ap.add_argument("--policy", default="llama:embedded", help="with --embedded: the sampler")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=300)
    ap.add_argument("--groups", type=int, default=2, help="with --embedded: groups, each followed by its update")
    ap.add_argument("--no-trl", action="store_true", help="time this project's trainer alone (no `bench` extra)")
    ap.add_argument("--per-token", action="store_true", help="the update's cost per sampled token by epochs and KL")
    ap.add_argument("--model", default=None, help="with --per-token: a local model directory (default: tiny)")
    ap.add_argument("--completion-tokens", type=int, default=64, help="with --per-token")
    ap.add_argument("--prompt-words", type=int, default=200, help="with --per-token")
    ap.add_argument("--settings", default="1:0,4:0,4:0.05", help="with --per-token: EPOCHS:KL,...")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.per_token:
        torch.set_num_threads(args.threads)
        per_token(args.model, G, args.prompt_words, args.completion_tokens, args.settings.split(","))
        return
    if args.embedded:
        embedded(args.policy, args.group_size, args.max_new_tokens, args.groups)
        return
    torch.set_num_threads(2)
    mine = ours(args.repeats)
    if args.no_trl:
        print(f"trainer_step ours_s={statistics.median(mine):.3f} runs={len(mine)}")
        return
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
