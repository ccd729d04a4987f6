"""A trained LoRA version reaches the llama.cpp sampler without a restart: the peft adapter the trainer writes
is served as a GGUF adapter, the sampled logprobs are then those of the torch model with that adapter, and a
run that trains records which version sampled each completion."""

from __future__ import annotations

import sqlite3

import pytest
import torch

from evolve.loop import SearchLoop, run_search
from evolve.training import ArchiveTrainer
from policies.from_spec import make_policy
from policies.policy import SamplingParams
from policies.trainer import PolicyTrainer, TrainConfig
from policies.transformers_policy import TransformersPolicy
from sandboxes.process import ProcessSandbox
from tests.helpers import randomise_lora_b, square_run
from tests.test_behaviour_logprobs import PROMPT, warped_logprobs
from tests.test_llama_policy import LOGPROB_BOUND

pytestmark = pytest.mark.slow
PARAMS = SamplingParams(temperature=0.8, top_p=1.0, max_new_tokens=60, seed=4)


def _perturbed_adapter(trainer: PolicyTrainer, seed: int, directory):
    """A LoRA adapter whose B matrices are not zero (a fresh one changes nothing), saved as the trainer saves."""
    randomise_lora_b(trainer.model, seed, scale=0.2)
    return trainer.save(directory)


def _gap(group, model, prompt_ids) -> float:
    return max(
        float((torch.tensor(g.logprobs) - warped_logprobs(model, prompt_ids, g.token_ids, PARAMS)).abs().max())
        for g in group
    )


def test_a_published_adapter_is_sampled_with_its_exact_logprobs_and_its_version(tiny_gguf, tiny_model_dir, tmp_path):
    llama = make_policy(f"llama:{tiny_gguf}")
    local = TransformersPolicy.load(str(tiny_model_dir))
    base = TransformersPolicy.load(str(tiny_model_dir)).model
    trainer = PolicyTrainer(local.model, local.tokenizer, local.render, TrainConfig(lora_rank=4))
    prompt_ids = local.tokenizer(local.render(PROMPT), add_special_tokens=False).input_ids
    llama.generate(PROMPT, PARAMS, 2)  # the prompt is cached with the base weights: a publish must drop it
    for version, seed in ((1, 0), (2, 1)):
        llama.publish(_perturbed_adapter(trainer, seed, tmp_path / f"v{version}"), version)
        trainer.model.eval()
        group = llama.generate(PROMPT, PARAMS, 3)
        assert {g.version for g in group} == {version}
        assert _gap(group, trainer.model, prompt_ids) < LOGPROB_BOUND
        assert _gap(group, base, prompt_ids) > 0.05  # the adapter really changed what was sampled from
    llama.close()


def test_a_training_run_on_the_llama_policy_records_the_version_of_each_completion(tmp_path, tiny_gguf):
    policy = make_policy(f"llama:{tiny_gguf}")
    # 8 evaluations took two groups here (12 took five): the base sampled the first, the version trained on it the
    # second; the asserts hold for any number of groups past one
    problem, archive, run, options = square_run(tmp_path, max_evaluations=8, train_every=1)
    trainer = ArchiveTrainer(
        archive, run.id, list(problem.components), options.variants, policy, TrainConfig(), tmp_path / "adapters"
    )
    steps = {options.members()[0].name: trainer.step}
    run_search(SearchLoop(problem, archive, policy, ProcessSandbox(2), run, options, train_steps=steps))
    con = sqlite3.connect(tmp_path / "a.db")
    numbers = [
        n
        for (n,) in con.execute(
            "SELECT v.number FROM completions c JOIN policy_versions v ON v.id = c.policy_version_id ORDER BY c.id"
        )
    ]
    assert numbers[0] == 0 and max(numbers) >= 1, numbers  # sampled first by the base, later by trained versions
    assert numbers == sorted(numbers)
    assert policy.version == max(numbers) or policy.version == max(numbers) + 1
    assert (tmp_path / "adapters" / f"v{max(numbers)}" / "adapter.gguf").is_file()
    policy.close()


def test_a_resumed_training_run_trains_on_from_its_newest_version(tmp_path, tiny_gguf):
    """The trainer's bf16 copy of a llama.cpp policy starts from the newest adapter on resume, not from a fresh
    LoRA (the next version would have been the base plus one step)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    problem, archive, run, options = square_run(tmp_path, max_evaluations=8, train_every=1)
    policy = make_policy(f"llama:{tiny_gguf}")
    trainer = ArchiveTrainer(
        archive, run.id, list(problem.components), options.variants, policy, TrainConfig(), tmp_path / "adapters"
    )
    steps = {options.members()[0].name: trainer.step}
    run_search(SearchLoop(problem, archive, policy, ProcessSandbox(2), run, options, train_steps=steps))
    policy.close()
    latest = max(archive.policy_versions(run.id), key=lambda v: v.number)
    saved = load_file(f"{latest.adapter_path}/adapter_model.safetensors")
    assert any(float(w.abs().sum()) > 0 for k, w in saved.items() if "lora_B" in k)  # trained: B moved from zero
    again = make_policy(f"llama:{tiny_gguf}")  # the resumed process: a new sampler, a new trainer
    resumed = ArchiveTrainer(
        archive, run.id, list(problem.components), options.variants, again, TrainConfig(), tmp_path / "adapters"
    )
    restored = get_peft_model_state_dict(resumed.trainer.model)
    assert restored.keys() == saved.keys()
    for key, weight in saved.items():
        torch.testing.assert_close(restored[key], weight, msg=key)
    again.close()
