"""The trainer on a tiny real model: the loss by hand, an update that moves logprobs, save/reload, failures."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest
import torch

from evolve.loop import SearchLoop, run_search
from evolve.training import ArchiveTrainer
from policies.cpu_dtype import bf16_matmul_is_fast, slow_bf16
from policies.policy import SamplingParams
from policies.tiny import tiny_model, tiny_tokenizer
from policies.trainer import PolicyTrainer, Sample, TrainConfig, ppo_clip_loss
from policies.training_groups import TrainingCompletion, TrainingGroup
from policies.transformers_policy import TransformersPolicy
from sandboxes.process import ProcessSandbox
from tests.helpers import RAGGED_COMPLETIONS, randomise_lora_b, square_run


def test_ppo_clip_both_ways_and_the_is_cap():
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))  # ratios
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, clipped, w = ppo_clip_loss(new, old, old, adv, clip_low=0.2, clip_high=0.28)
    # min(r*A, clip(r)*A): A>0 & r=1.5 -> 1.28 (clipped); A<0 & r=1.5 -> -1.5; A>0 & r=0.5 -> 0.5; A<0 & r=0.5 -> -0.8
    torch.testing.assert_close(loss, -torch.tensor([1.28, -1.5, 0.5, -0.8]))
    assert clipped.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert w.tolist() == [1.0, 1.0, 1.0, 1.0]
    new.requires_grad_(True)
    loss, _, _ = ppo_clip_loss(new, old, old, adv)
    loss.sum().backward()
    assert new.grad[0] == 0 and new.grad[3] == 0  # clipped tokens carry no gradient
    assert new.grad[1] != 0 and new.grad[2] != 0
    sampler = torch.tensor([-5.0, 0.0, 0.3, -0.2])  # the sampler thought token 0 much less likely
    _, _, w = ppo_clip_loss(old.clone(), old, sampler, adv, is_cap=2.0)
    torch.testing.assert_close(w, torch.tensor([2.0, 1.0, float(np.exp(-0.3)), float(np.exp(0.2))]))


@pytest.fixture(scope="module")
def tiny():
    tok = tiny_tokenizer()
    return tok, tiny_model(tok, seed=1)


def _group(policy: TransformersPolicy, prompt: str, rewards: list[list[list[float]]]) -> TrainingGroup:
    sampled = policy.generate(
        prompt, SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12, seed=0), len(rewards)
    )
    return TrainingGroup(
        1,
        prompt,
        [
            TrainingCompletion(i, g.token_ids, g.logprobs, 1.0, np.array(r))
            for i, (g, r) in enumerate(zip(sampled, rewards, strict=True))
        ],
    )


def _logprob_sum(trainer: PolicyTrainer, group: TrainingGroup, i: int) -> float:
    c = group.completions[i]
    ids = trainer.tokenizer(group.prompt, add_special_tokens=False).input_ids
    with torch.no_grad():
        return float(trainer.token_logprobs(Sample(ids, c.token_ids, c.logprobs, 1.0, 0.0)).sum())


def test_update_moves_positive_advantage_completions_up(tiny, tmp_path):
    tok, model = tiny
    policy = TransformersPolicy(model, tok, "tiny")
    trainer = PolicyTrainer(model, tok, policy.render, TrainConfig(learning_rate=5e-3, lora_rank=8, epochs=4))
    policy.model = trainer.model
    # completion 0 holds two specialists, 1 a weak compromise, 2 and 3 nothing that worked
    group = _group(policy, "hello world", [[[1, 0], [0, 1]], [[0.3, 0.3], [0, 0]], [[0, 0], [0, 0]], [[0, 0], [0, 0]]])
    before = [_logprob_sum(trainer, group, i) for i in range(4)]
    stats = trainer.update([group])
    after = [_logprob_sum(trainer, group, i) for i in range(4)]
    assert stats.samples == 4 and stats.optimizer_steps == 4 and np.isfinite(stats.loss)
    assert after[0] > before[0]
    assert after[2] < before[2] and after[3] < before[3]
    assert stats.reward_diversity > 0 and stats.set_reward_mean > 0

    # save, reload into a fresh copy of the base model, identical logprobs
    directory = trainer.save(tmp_path / "v1")
    fresh = TransformersPolicy(tiny_model(tok, seed=1), tok, "tiny")
    fresh.publish(directory, 1)
    assert fresh.version == 1
    reloaded = PolicyTrainer(fresh.model, tok, fresh.render, TrainConfig())
    for i in range(4):
        assert _logprob_sum(reloaded, group, i) == pytest.approx(after[i], abs=1e-4)


def test_groups_with_all_zero_advantages_are_skipped(tiny):
    tok, _ = tiny
    model = tiny_model(tok, seed=2)
    policy = TransformersPolicy(model, tok, "tiny")
    trainer = PolicyTrainer(model, tok, policy.render, TrainConfig())
    flat = _group(policy, "x", [[[0.5, 0.5]], [[0.5, 0.5]]])
    stats = trainer.update([flat])
    assert stats.samples == 0 and stats.skipped == {"all advantages zero": 1}


def test_a_bf16_model_trains_in_float32_where_bf16_products_are_slow(tiny):
    tok, _ = tiny
    policy = TransformersPolicy(tiny_model(tok, seed=3).to(torch.bfloat16), tok, "tiny")
    trainer = PolicyTrainer(policy.model, tok, policy.render, TrainConfig(learning_rate=5e-3, lora_rank=8))
    base = {p.dtype for name, p in trainer.model.named_parameters() if "lora_" not in name}
    assert base == {torch.bfloat16 if bf16_matmul_is_fast() else torch.float32}  # this machine's own CPU
    policy.model = trainer.model  # as ArchiveTrainer shares an in-process policy's model
    shown = "float32" if base == {torch.float32} else "bfloat16"
    assert policy.description.startswith(f"transformers on cpu, {shown}")  # the run's opening line says so
    stats = trainer.update([_group(policy, "hello", [[[1, 0]], [[0, 0]]])])
    assert stats.samples == 2 and np.isfinite(stats.loss)
    # the rule, for a CPU with and without fast bf16 products
    bf16_model = tiny_model(tok, seed=3).to(torch.bfloat16)
    assert slow_bf16(bf16_model, fast=False) and not slow_bf16(bf16_model, fast=True)
    assert not slow_bf16(tiny_model(tok, seed=3), fast=False)  # float32 weights are float32 already


@pytest.mark.slow
def test_train_every_publishes_versions_and_attributes_completions(tmp_path, tiny_model_dir):
    problem, archive, run, options = square_run(tmp_path, max_evaluations=10, train_every=1)
    policy = TransformersPolicy.load(str(tiny_model_dir))
    trainer = ArchiveTrainer(
        archive,
        run.id,
        list(problem.components),
        2,
        policy,
        TrainConfig(learning_rate=1e-4, lora_rank=4),
        tmp_path / "adapters",
    )
    steps = {options.members()[0].name: trainer.step}
    loop = SearchLoop(problem, archive, policy, ProcessSandbox(slots=2), run, options, train_steps=steps)
    assert run_search(loop) == "evaluation budget reached"
    con = sqlite3.connect(tmp_path / "a.db")
    versions = con.execute("SELECT number, adapter_path, parent_id FROM policy_versions ORDER BY number").fetchall()
    assert len(versions) >= 3 and versions[0][1] is None
    assert all((tmp_path / "adapters" / f"v{n}" / "adapter_model.safetensors").is_file() for n, _, _ in versions[1:])
    by_version = con.execute(
        "SELECT v.number, COUNT(*) FROM completions c JOIN policy_versions v "
        "ON c.policy_version_id = v.id GROUP BY v.number"
    ).fetchall()
    assert len(by_version) >= 2  # completions were sampled by at least two versions
    # group indices (and so sampling seeds and islands) keep counting across updates
    seeds = [json.loads(x)["seed"] for (x,) in con.execute("SELECT MIN(sampling) FROM completions GROUP BY prompt_id")]
    assert len(seeds) == len(set(seeds)) >= 3
    assert loop.stats.train_updates >= 2 and loop.stats.train_failures == 0


@pytest.mark.slow
def test_a_failed_update_keeps_the_old_version_serving(tmp_path, tiny_model_dir):
    problem, archive, run, options = square_run(tmp_path, max_evaluations=6, train_every=1)
    policy = TransformersPolicy.load(str(tiny_model_dir))
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the adapters folder should go")
    trainer = ArchiveTrainer(
        archive, run.id, list(problem.components), 2, policy, TrainConfig(learning_rate=1e-2), blocker
    )
    from peft import get_peft_model_state_dict

    before = {k: v.clone() for k, v in get_peft_model_state_dict(trainer.trainer.model).items()}
    steps = {options.members()[0].name: trainer.step}
    loop = SearchLoop(problem, archive, policy, ProcessSandbox(slots=2), run, options, train_steps=steps)
    assert run_search(loop) == "evaluation budget reached"
    assert loop.stats.train_failures >= 1 and policy.version == 0
    after = get_peft_model_state_dict(trainer.trainer.model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert "update failed" in loop.stats.last_train


COMPLETIONS = RAGGED_COMPLETIONS


def _old_logprobs_seen(monkeypatch, trainer: PolicyTrainer) -> tuple[int, list[tuple[tuple, torch.Tensor]], dict]:
    """An update of 2 groups x 4 completions on `trainer`: the completion rows it ran without gradients, each
    (prompt, completion) with the old logprobs its loss divided by, and every sample's logprobs under the starting
    weights (eval mode)."""
    import policies.trainer as trainer_module
    from policies.shared_prompt import completion_logprobs

    tok = trainer.tokenizer
    randomise_lora_b(trainer.model, seed=7, scale=0.05)  # the first step then moves every layer's output
    groups = [
        TrainingGroup(
            g,
            "abcdefgh"[g:],
            [TrainingCompletion(i, c, [-1.0] * len(c), 0.7, np.array([[i % 3]])) for i, c in enumerate(COMPLETIONS)],
        )
        for g in range(2)
    ]
    prompts = [tuple(tok(g.prompt, add_special_tokens=False).input_ids) for g in groups]
    trainer.model.eval()
    with torch.no_grad():
        before = {
            (p, tuple(c)): lp
            for p in prompts
            for c, lp in zip(COMPLETIONS, completion_logprobs(trainer.model, list(p), COMPLETIONS, 0.7), strict=True)
        }
    rows_without_grad: list[int] = []  # completion rows run with gradients off (the old logprobs' pass)

    def count(_module, _args, kwargs, _output) -> None:
        if kwargs.get("cache") is not None and not torch.is_grad_enabled():
            rows_without_grad.append(kwargs["input_ids"].shape[0])

    trainer.model.get_base_model().model.register_forward_hook(count, with_kwargs=True)
    used: list[tuple[tuple, torch.Tensor]] = []
    sample_loss, clip_loss = PolicyTrainer._sample_loss, trainer_module.ppo_clip_loss
    current: list[tuple] = []

    def recording_sample_loss(self, s, *args):
        current[:] = [(tuple(s.prompt_ids), tuple(s.completion_ids))]
        return sample_loss(self, s, *args)

    def recording_clip_loss(new, old, *args, **kwargs):
        used.append((current[0], old.clone()))
        return clip_loss(new, old, *args, **kwargs)

    monkeypatch.setattr(PolicyTrainer, "_sample_loss", recording_sample_loss)
    monkeypatch.setattr(trainer_module, "ppo_clip_loss", recording_clip_loss)
    stats = trainer.update(groups)
    rows = sum(rows_without_grad)
    assert stats.samples == 8 and stats.optimizer_steps == 6  # 3 minibatches an epoch, 2 epochs
    assert sorted(key for key, _ in used) == sorted(list(before) * 2)
    trainer.model.eval()
    with torch.no_grad():
        after = completion_logprobs(trainer.model, list(prompts[0]), COMPLETIONS, 0.7)
    moved = max(
        float((a - before[(prompts[0], tuple(c))]).abs().max()) for a, c in zip(after, COMPLETIONS, strict=True)
    )
    assert moved > 1e-3  # the steps moved the weights: old logprobs taken after one would show
    return rows, used, before


def test_old_logprobs_are_the_weights_before_the_update_and_only_later_minibatches_pay_a_pass(monkeypatch):
    """The ratio's denominator is each sample's logprobs under the weights the update started from, in every
    epoch. The first minibatch runs before any optimizer step, so its samples take theirs from their own first
    pass: the pass without gradients beforehand covers the other samples alone (5 of 8 here, with minibatches of
    3), where it covered all 8 before."""
    tok = tiny_tokenizer()
    torch.manual_seed(5)
    config = TrainConfig(
        lora_rank=4, lora_alpha=8, learning_rate=1e-2, skip_zero_advantage=False, minibatch=3, epochs=2
    )
    rows, used, before = _old_logprobs_seen(
        monkeypatch, PolicyTrainer(tiny_model(tok, seed=3), tok, lambda p: p, config)
    )
    assert rows == 5
    for key, old in used:
        torch.testing.assert_close(old, before[key], rtol=1e-5, atol=1e-5)


def test_with_a_dropout_every_old_logprob_comes_from_the_pass_in_eval_mode(monkeypatch):
    """An adapter passed in with LoRA dropout: a first pass in training mode is noised, so it cannot stand for the
    starting weights' logprobs (off by up to 0.07 here); every sample then gets the pass without gradients."""
    from peft import LoraConfig, get_peft_model

    tok = tiny_tokenizer()
    torch.manual_seed(5)
    lora = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.3, target_modules=["q_proj", "v_proj", "up_proj"])
    model = get_peft_model(tiny_model(tok, seed=3), lora)
    config = TrainConfig(
        lora_rank=4, lora_alpha=8, learning_rate=1e-2, skip_zero_advantage=False, minibatch=3, epochs=2
    )
    rows, used, before = _old_logprobs_seen(monkeypatch, PolicyTrainer(model, tok, lambda p: p, config))
    assert rows == 8
    for key, old in used:
        torch.testing.assert_close(old, before[key], rtol=1e-5, atol=1e-5)


def test_an_update_of_zero_epochs_takes_no_step_and_no_pass():
    """epochs=0: nothing to train, so no optimizer step and no pass for old logprobs (it raised IndexError)."""
    tok = tiny_tokenizer()
    config = TrainConfig(lora_rank=4, epochs=0, skip_zero_advantage=False)
    trainer = PolicyTrainer(tiny_model(tok, seed=1), tok, lambda p: p, config)
    completions = [TrainingCompletion(i, [5, 6, 7], [-1.0] * 3, 1.0, np.array([[float(i)]])) for i in range(3)]
    stats = trainer.update([TrainingGroup(0, "abc", completions)])
    assert stats.samples == 3 and stats.optimizer_steps == 0 and stats.tokens == 0
