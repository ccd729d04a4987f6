"""Enough learning per update (issue 61), on the tiny model's real forward passes: several PPO epochs over one group
of 8 so that the clip acts, and a KL term that holds the adapter near the base model (the adapter switched off)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from policies.policy import SamplingParams
from policies.tiny import tiny_model, tiny_tokenizer
from policies.trainer import PolicyTrainer, Sample, TrainConfig
from policies.training_groups import TrainingCompletion, TrainingGroup
from policies.transformers_policy import TransformersPolicy
from tests.helpers import randomise_lora_b

G = 8
PROMPT = "count to ten"


def fresh_trainer(config: TrainConfig) -> tuple[PolicyTrainer, TransformersPolicy]:
    """The same tiny model and the same LoRA initialisation every time, so two configs start level."""
    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = tiny_model(tok, seed=1)
    policy = TransformersPolicy(model, tok, "tiny")
    trainer = PolicyTrainer(model, tok, policy.render, config)
    policy.model = trainer.model
    return trainer, policy


@pytest.fixture(scope="module")
def group_of_8() -> TrainingGroup:
    """8 completions sampled by the untrained tiny model, half rewarded: advantages +1 and -1."""
    _, policy = fresh_trainer(TrainConfig(lora_rank=8))
    sampled = policy.generate(PROMPT, SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3), G)
    rewards = [np.array([[1.0 if i % 2 == 0 else 0.0]]) for i in range(G)]
    completions = [
        TrainingCompletion(i, s.token_ids, s.logprobs, 1.0, r)
        for i, (s, r) in enumerate(zip(sampled, rewards, strict=True))
    ]
    return TrainingGroup(1, PROMPT, completions)


def test_later_epochs_over_the_same_group_of_8_are_clipped(group_of_8):
    trainer, _ = fresh_trainer(TrainConfig(method="grpo", learning_rate=2e-2, lora_rank=8, epochs=3, minibatch=G))
    stats = trainer.update([group_of_8])
    assert stats.samples == G and stats.optimizer_steps == 3
    first, *later = stats.epoch_clip_fractions
    assert first == 0.0, "the first epoch's one minibatch runs at ratio 1: nothing to clip"
    assert len(later) == 2 and all(f > 0 for f in later), stats.epoch_clip_fractions
    once, _ = fresh_trainer(TrainConfig(method="grpo", learning_rate=2e-2, lora_rank=8, epochs=1, minibatch=G))
    assert once.update([group_of_8]).epoch_clip_fractions == [0.0]


def kl_to_base(trainer: PolicyTrainer, group: TrainingGroup) -> float:
    """Mean per-token k3 estimate of KL(policy || base) on the group's completions."""
    ids = trainer.tokenizer(trainer.render(group.prompt), add_special_tokens=False).input_ids
    total, tokens = 0.0, 0
    with torch.no_grad():
        for c in group.completions:
            sample = Sample(ids, c.token_ids, c.logprobs, 1.0, 0.0)
            new = trainer.token_logprobs(sample)
            with trainer.model.disable_adapter():
                ref = trainer.token_logprobs(sample)
            delta = ref - new
            total += float((torch.exp(delta) - delta - 1.0).sum())
            tokens += len(c.token_ids)
    return total / tokens


def test_the_kl_term_pulls_a_moved_adapter_back_towards_the_base_model(group_of_8):
    """An adapter moved off the base (random LoRA B) and a group without spread (every advantage 0, kept): the
    policy gradient is nil, so what moves the weights is the KL term alone, and it moves them towards the base."""
    flat = TrainingGroup(2, PROMPT, [replace(c, answers=np.array([[0.5]])) for c in group_of_8.completions])
    runs = {}
    for coef in (0.0, 0.5):
        config = TrainConfig(
            method="grpo",
            learning_rate=1e-2,
            lora_rank=8,
            epochs=4,
            minibatch=G,
            kl_coef=coef,
            skip_zero_advantage=False,
        )
        trainer, _ = fresh_trainer(config)
        randomise_lora_b(trainer.model, seed=5, scale=0.3)
        before = kl_to_base(trainer, flat)
        stats = trainer.update([flat])
        runs[coef] = (before, kl_to_base(trainer, flat), stats)
    before, after, stats = runs[0.5]
    assert before > 1e-3, "the adapter starts away from the base"
    assert after < 0.5 * before, (before, after)
    assert stats.epoch_kl[0] > stats.epoch_kl[-1] > 0, stats.epoch_kl  # falling epoch by epoch
    assert runs[0.0][0] == pytest.approx(runs[0.0][1], rel=1e-6), "without the term nothing moves"
    assert runs[0.0][2].epoch_kl == [0.0] * 4  # and no reference pass is made at coefficient 0


def test_a_run_asks_for_epochs_and_a_kl_term_and_its_updates_get_them():
    from evolve.options import RunOptions, invalid_value
    from evolve.search import train_config

    config = train_config(RunOptions(train_epochs=4, kl_coef=0.05))
    assert (config.epochs, config.kl_coef) == (4, 0.05)
    assert (train_config(RunOptions()).epochs, train_config(RunOptions()).kl_coef) == (1, 0.0)
    assert invalid_value({"train_epochs": 0}) == "--train-epochs 0: give a value from 1 to 64"
    assert invalid_value({"kl_coef": -0.1}) == "--kl-coef -0.1: give a value >= 0"
