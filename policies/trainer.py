"""The policy trainer: LoRA updates with a PPO-clip loss on group advantages (VPO by default).

Per update: advantages per group from the estimator; old logprobs recomputed with the current weights (the
ratio's denominator); the sampler's stored logprobs only enter a truncated importance weight that corrects
for the sampler/trainer mismatch; asymmetric clipping; token-level aggregation (every token of a completion
carries its completion's advantage); optional KL to the base model (the adapter disabled).

The sampler and the trainer may be different runtimes: vLLM, or llama.cpp on the Q4_K_M GGUF while this
trainer runs transformers on the same weights dequantised to bf16 (float32 on a CPU without native bf16, where
bf16 matrix products are many times slower: policies/cpu_dtype.py). The stored logprobs are then the behaviour
policy (each the exact probability the sampler drew its token with, after temperature, top-k and top-p), and
min(exp(old - sampler), is_cap) reweights each token for the gap, as RL systems whose sampler and trainer
differ do (truncated importance sampling); `UpdateStats.is_weight_mean` shows how far apart they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from policies.advantages import make_estimator
from policies.cpu_dtype import slow_bf16
from policies.optimizer_state import resume_optimizer, save_optimizer
from policies.shaping import LAZY_PENALTY, NORMALISATION, SKIP_ZERO_ADVANTAGE, select
from policies.shared_prompt import SharedPrompt, completion_logprobs, completions_after, run_prompt
from policies.training_groups import TrainingGroup

ShouldStop = Callable[[], bool]  # asked between samples: True gives the update up (`UpdateAbandoned`)


def never() -> bool:
    return False


class UpdateAbandoned(Exception):
    """The update was given up between two groups because the run is stopping (Ctrl-C, SIGTERM). The weights
    and optimizer state are then part-way through the update: the caller restores them (`ArchiveTrainer.step`)."""


@dataclass(frozen=True)
class TrainConfig:
    """How the policy is updated on its own groups; stored with every policy version it produces."""

    # The advantage estimator (policies/advantages.py): "vpo" (set reward under W random scalarisations),
    # "grpo" (mean of the answers' scalar views) or "multi-rlvr" (best answer under one fixed scalarisation).
    method: str = "vpo"
    # LoRA adapter: rank, scaling alpha, and the projection layers it wraps.
    lora_rank: int = 16
    lora_alpha: int = 32
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    learning_rate: float = 2e-5  # AdamW on the adapter weights only
    # PPO-clip range on the ratio new/old policy: [1 - clip_low, 1 + clip_high] (asymmetric, as in DAPO, so
    # unlikely tokens with positive advantage can still rise).
    clip_low: float = 0.2
    clip_high: float = 0.28
    # Cap on the importance weight old/sampler that corrects for the sampler's own logprobs (vLLM's or llama.cpp's
    # numerics differ from the trainer's); larger weights are truncated (truncated importance sampling).
    is_cap: float = 2.0
    kl_coef: float = 0.0  # weight of a k3 KL penalty to the base model (adapter off); 0 switches it off
    epochs: int = 1  # passes over the batch per update
    minibatch: int = 8  # completions per optimizer step
    max_completion_tokens: int | None = None  # train on at most this many leading tokens of a completion
    # Train on groups sampled by the newest policy version and this many versions before it (staleness bound);
    # `evolve train` passes a huge number to use every group in the archive.
    versions_back: int = 1
    seed: int = 0  # shuffling of samples into minibatches
    # Reward shaping and batch selection for a model that mostly copies (policies/shaping.py explains each):
    # leave zero-advantage groups and completions out; the reward of an echo or duplicate (0: off, scored as a
    # failure); "bounds" or "group" (each component stretched to [0, 1] over its group) before scalarising.
    skip_zero_advantage: bool = SKIP_ZERO_ADVANTAGE
    lazy_penalty: float = LAZY_PENALTY
    reward_normalisation: str = NORMALISATION

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "target_modules": list(self.target_modules)}


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    sampler_logprobs: list[float]
    temperature: float
    advantage: float
    old_logprobs: Any = None
    group: int = 0  # samples of one group share their prompt: its forward pass runs once for all of them


@dataclass
class UpdateStats:
    loss: float = 0.0
    clip_fraction: float = 0.0
    kl: float = 0.0
    is_weight_mean: float = 1.0
    set_reward_mean: float = 0.0
    set_reward_std: float = 0.0
    reward_diversity: float = 0.0
    groups: int = 0
    samples: int = 0
    tokens: int = 0
    optimizer_steps: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    # Each epoch's share of tokens whose ratio the clip held, in order. The first epoch's first minibatch runs at
    # ratio 1 (its old logprobs are its own), so a one-epoch update of one minibatch never clips: PPO there is
    # REINFORCE. Later epochs over the same batch are what let the clip act (issue 61: 10 of 154 updates clipped).
    epoch_clip_fractions: list[float] = field(default_factory=list)
    epoch_kl: list[float] = field(default_factory=list)  # each epoch's mean k3 KL per token to the base model


def ppo_clip_loss(
    new_logprobs: Any,
    old_logprobs: Any,
    sampler_logprobs: Any,
    advantages: Any,
    *,
    clip_low: float = TrainConfig.clip_low,
    clip_high: float = TrainConfig.clip_high,
    is_cap: float = TrainConfig.is_cap,
) -> tuple[Any, Any, Any]:
    """Per-token PPO-clip loss (to be summed and divided by the token count), clipped mask, IS weights.

    All inputs are 1-D over tokens; `advantages` holds each token's completion advantage.
    """
    import torch

    ratio = torch.exp(new_logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    surrogate = torch.minimum(ratio * advantages, clipped * advantages)
    is_weight = torch.clamp(torch.exp(old_logprobs - sampler_logprobs), max=is_cap).detach()
    was_clipped = (surrogate != ratio * advantages).float()
    return -surrogate * is_weight, was_clipped, is_weight


def reward_diversity(groups: Sequence[TrainingGroup]) -> float:
    """Mean pairwise distance between the non-zero answer vectors of each group, averaged over groups."""
    values = []
    for g in groups:
        rows = g.rewards().reshape(-1, g.rewards().shape[-1])
        rows = rows[np.abs(rows).sum(axis=1) > 0]
        if len(rows) >= 2:
            d = np.sqrt(((rows[:, None, :] - rows[None, :, :]) ** 2).sum(-1))
            values.append(d.sum() / (len(rows) * (len(rows) - 1)))
    return float(np.mean(values)) if values else 0.0


class PolicyTrainer:
    """Trains a transformers causal LM in place through a LoRA adapter; `model` may be shared with a policy."""

    def __init__(self, model: Any, tokenizer: Any, render: Callable[[str], str], config: TrainConfig) -> None:
        import torch
        from peft import LoraConfig, PeftModel, get_peft_model

        self.config, self.tokenizer, self.render = config, tokenizer, render
        self.estimator = make_estimator(config.method)
        if slow_bf16(model):  # a CPU without native bf16: its bf16 products run many times slower (cpu_dtype.py)
            model = model.float()
        if not isinstance(model, PeftModel):
            present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
            targets = [t for t in config.target_modules if t in present]
            lora = LoraConfig(
                r=config.lora_rank,
                lora_alpha=config.lora_alpha,
                target_modules=targets,
                lora_dropout=0.0,
                bias="none",
                task_type="CAUSAL_LM",
            )
            model = get_peft_model(model, lora)
        self.model = model
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate, weight_decay=0.0)
        self.device = next(model.parameters()).device
        self._rng = np.random.default_rng(config.seed)

    # ---- data -------------------------------------------------------------------------------------------
    def samples(self, groups: Sequence[TrainingGroup], stats: UpdateStats) -> list[Sample]:
        cfg = self.config
        selection = select(
            groups,
            self.estimator,
            lambda: int(self._rng.integers(2**31)),
            skip_zero_advantage=cfg.skip_zero_advantage,
            normalisation=cfg.reward_normalisation,
            lazy_penalty=cfg.lazy_penalty,
        )
        chosen = selection.chosen
        for reason, n in selection.skipped.items():
            stats.skipped[reason] = stats.skipped.get(reason, 0) + n
        stats.groups = len({s.group for s in chosen})
        prompts: dict[int, list[int]] = {}
        out: list[Sample] = []
        for s in chosen:
            g, c = groups[s.group], groups[s.group].completions[s.completion]
            if s.group not in prompts:
                prompts[s.group] = self.tokenizer(self.render(g.prompt), add_special_tokens=False).input_ids
            n = len(c.token_ids) if cfg.max_completion_tokens is None else cfg.max_completion_tokens
            out.append(
                Sample(prompts[s.group], c.token_ids[:n], c.logprobs[:n], c.temperature, s.advantage, group=s.group)
            )
        set_rewards = [float(v) for r in selection.shaped for v in r.max(axis=1).mean(axis=1)]
        if set_rewards:
            stats.set_reward_mean, stats.set_reward_std = float(np.mean(set_rewards)), float(np.std(set_rewards))
        stats.reward_diversity = reward_diversity(groups)
        return out

    # ---- forward ----------------------------------------------------------------------------------------
    def token_logprobs(self, sample: Sample) -> Any:
        """Logprobs of the completion tokens under the current weights, at the sampling temperature."""
        prompt, completion = sample.prompt_ids, [sample.completion_ids]
        return completion_logprobs(self.model, prompt, completion, sample.temperature, self.device)[0]

    # ---- update -----------------------------------------------------------------------------------------
    def update(
        self, groups: Sequence[TrainingGroup], skipped: dict[str, int] | None = None, should_stop: ShouldStop = never
    ) -> UpdateStats:
        """One update on the groups. `should_stop` is asked before each group's prompt pass and each pass over its
        completions (seconds on a CPU, the whole update minutes), so that a run being stopped waits for one pass
        at most; a yes raises `UpdateAbandoned`."""
        import torch

        stats = UpdateStats(skipped=dict(skipped or {}))
        samples = self.samples(groups, stats)
        stats.samples = len(samples)
        if not samples or self.config.epochs < 1:
            return stats
        orders = [self._rng.permutation(len(samples)) for _ in range(self.config.epochs)]
        # The old logprobs (the ratio's denominator) are those of the weights before the update. The first
        # minibatch runs before any optimizer step, so its samples' own logprobs, detached, are the old ones
        # (`_sample_loss` keeps them for later epochs); only the samples whose first pass comes after a step need
        # a pass of their own beforehand. A single minibatch needs none (as TRL skips it for one step). Where a
        # dropout is active, a training pass is noisier than the starting weights' logprobs: all get the pass.
        first = set() if _dropout_active(self.model) else set(orders[0][: self.config.minibatch].tolist())
        later = [s for i, s in enumerate(samples) if i not in first]
        if later:
            self.model.eval()
            with torch.no_grad():
                for same_prompt in by_prompt(later):
                    prompt = run_prompt(self.model, same_prompt[0].prompt_ids, self.device)
                    for part in passes(same_prompt):
                        _check(should_stop)
                        for s, logprobs in zip(part, self._after(prompt, part), strict=True):
                            s.old_logprobs = logprobs
        self.model.train()
        totals = {"loss": 0.0, "clipped": 0.0, "kl": 0.0, "is": 0.0, "tokens": 0}
        for order in orders:
            at_start = dict(totals)
            for start in range(0, len(order), self.config.minibatch):
                chunk = [samples[i] for i in order[start : start + self.config.minibatch]]
                n_tokens = sum(len(s.completion_ids) for s in chunk)
                self.optimizer.zero_grad()
                for same_prompt in by_prompt(chunk):
                    self._accumulate(same_prompt, n_tokens, totals, should_stop)
                torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], 1.0)
                self.optimizer.step()
                stats.optimizer_steps += 1
            seen = max(totals["tokens"] - at_start["tokens"], 1)
            stats.epoch_clip_fractions.append((totals["clipped"] - at_start["clipped"]) / seen)
            stats.epoch_kl.append((totals["kl"] - at_start["kl"]) / seen)
        self.model.eval()
        _release_freed_memory()
        count = max(totals["tokens"], 1)
        stats.tokens = int(totals["tokens"])
        stats.loss, stats.clip_fraction = totals["loss"] / count, totals["clipped"] / count
        stats.kl, stats.is_weight_mean = totals["kl"] / count, totals["is"] / count
        if not math.isfinite(stats.loss):
            raise FloatingPointError("the update produced a non-finite loss")
        return stats

    def _after(self, prompt: SharedPrompt, part: Sequence[Sample]) -> list[Any]:
        completions = [s.completion_ids for s in part]
        return completions_after(self.model, prompt, completions, part[0].temperature, self.device)

    def _accumulate(
        self, same_prompt: list[Sample], n_tokens: int, totals: dict[str, float], should_stop: ShouldStop
    ) -> None:
        """The loss of one prompt's samples: the prompt's forward pass once, then the completions in passes of at
        most PASS_TOKENS tokens, each with its own backward, and the prompt's backward once after the last."""
        import torch

        _check(should_stop)
        parts = passes(same_prompt)
        prompt = run_prompt(self.model, same_prompt[0].prompt_ids, self.device, split=len(parts) > 1)
        reference = None
        if self.config.kl_coef > 0:  # the base model's logprobs (adapter off); skipped entirely at coefficient 0
            with torch.no_grad(), self.model.disable_adapter():
                reference = run_prompt(self.model, same_prompt[0].prompt_ids, self.device)
        for part in parts:
            _check(should_stop)
            refs: list[Any] = [None] * len(part)
            if reference is not None:
                with torch.no_grad(), self.model.disable_adapter():
                    refs = self._after(reference, part)
            loss = torch.zeros((), device=self.device)
            for s, new, ref in zip(part, self._after(prompt, part), refs, strict=True):
                loss = loss + self._sample_loss(s, new, ref, totals)
            (loss / n_tokens).backward()
        prompt.backward()

    def _sample_loss(self, s: Sample, new: Any, ref: Any, totals: dict[str, float]) -> Any:
        """One completion's summed PPO-clip loss (plus its KL term when there is a reference), its figures added
        to `totals`."""
        import torch

        if s.old_logprobs is None:  # its first pass, before any optimizer step (`update`): these are the old ones
            s.old_logprobs = new.detach()
        old = s.old_logprobs
        sampler = torch.tensor(s.sampler_logprobs, device=self.device, dtype=new.dtype)
        adv = torch.full_like(new, s.advantage)
        per_token, clipped, is_weight = ppo_clip_loss(
            new,
            old,
            sampler,
            adv,
            clip_low=self.config.clip_low,
            clip_high=self.config.clip_high,
            is_cap=self.config.is_cap,
        )
        loss = per_token.sum()
        if ref is not None:
            delta = ref - new
            kl = torch.exp(delta) - delta - 1.0  # k3 estimator, >= 0
            loss = loss + self.config.kl_coef * kl.sum()
            totals["kl"] += float(kl.detach().sum())
        totals["loss"] += float(per_token.detach().sum())
        totals["clipped"] += float(clipped.sum())
        totals["is"] += float(is_weight.sum())
        totals["tokens"] += len(s.completion_ids)
        return loss

    def save(self, directory: Path) -> Path:
        """The adapter (what a server loads) and, beside it, the optimizer's state (what training resumes from)."""
        directory.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(directory)
        save_optimizer(self.optimizer, directory)
        return directory

    def resume_optimizer(self, directory: Path) -> bool:
        return resume_optimizer(self.optimizer, directory, self.config.learning_rate, self.device)


# Completion tokens one forward and backward pass holds at once. A group of 4 completions of 2,048 tokens in one
# pass held 24 GB (then mostly their logits, which policies/head_logprobs.py no longer keeps) and was OOM-killed;
# the decoder's own activations are still a few MB a token. A group past the budget takes several completion
# passes after its prompt's one pass (policies/shared_prompt.py).
PASS_TOKENS = 1024


def by_prompt(samples: Sequence[Sample]) -> list[list[Sample]]:
    """The samples by group (one prompt) and sampling temperature, in first-seen order. A group whose samples
    fall in two minibatches has its prompt run once in each (and once an epoch)."""
    same: dict[tuple[int, float], list[Sample]] = {}
    for s in samples:
        same.setdefault((s.group, s.temperature), []).append(s)
    return list(same.values())


def passes(same_prompt: Sequence[Sample], budget: int | None = None) -> list[list[Sample]]:
    """One prompt's samples in passes of at most `budget` completion tokens (PASS_TOKENS), in order; a
    completion longer than the budget is a pass of its own."""
    budget = PASS_TOKENS if budget is None else budget
    runs: list[list[Sample]] = [[]]
    for s in same_prompt:
        if runs[-1] and sum(len(x.completion_ids) for x in runs[-1]) + len(s.completion_ids) > budget:
            runs.append([])
        runs[-1].append(s)
    return [run for run in runs if run]


def _dropout_active(model: Any) -> bool:
    """Whether a pass in training mode differs from one in eval mode: a dropout with p > 0 (this trainer's own LoRA
    has none, an adapter passed in may) or attention dropout in the model's config."""
    import torch

    config = getattr(model, "config", None)
    if (getattr(config, "attention_dropout", 0.0) or 0.0) > 0:
        return True
    return any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())


def _release_freed_memory() -> None:
    """Hand the update's freed activations back to the system. glibc keeps freed heap pages for reuse, so the
    process held the peak of its largest update (8.6 GB after two groups) while llama.cpp sampled beside it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass


def _check(should_stop: ShouldStop) -> None:
    if should_stop():
        raise UpdateAbandoned("the run is stopping: the policy update was abandoned between two groups")
