"""A training step that fails after its publish serves the base model again, and means the same for one
server, several servers and an in-process model: what samples afterwards is the base model, and the version the
completions carry (the one the loop records them under) is the base's. The failure is a real one: the archive's
SQLite database refuses the version row after the adapter was trained, saved and published. (The transformers
model, which shares its weights with the trainer, is covered in test_versions.py.)"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from evolve.archive import Archive
from evolve.training import ArchiveTrainer
from policies.from_spec import make_policy
from policies.http_policy import HttpPolicy
from policies.multi_server import MultiServerPolicy
from policies.policy import Policy, SamplingParams
from policies.trainer import TrainConfig
from policies.transformers_policy import TransformersPolicy
from tests.helpers import TinySearch, refuse_version_rows
from tests.openai_server import LoopbackServer
from tests.test_behaviour_logprobs import PROMPT, warped_logprobs
from tests.test_llama_policy import LOGPROB_BOUND

pytestmark = pytest.mark.slow
PARAMS = SamplingParams(temperature=0.8, top_p=1.0, max_new_tokens=24, seed=4)
# a large step, so that the adapter a rollback leaves behind would change the logprobs far beyond the bounds
CONFIG = TrainConfig(learning_rate=2e-2, lora_rank=4)


def _failed_step(
    searched: TinySearch, tmp_path: Path, policy: Policy, trainer_model: str | None = None
) -> ArchiveTrainer:
    """A trainer on a copy of the searched archive, after one step whose version row was refused."""
    archive = Archive(searched.copy_to(tmp_path / "a.db"))
    trainer = ArchiveTrainer(
        archive,
        searched.run_id,
        searched.components,
        2,
        policy,
        CONFIG,
        tmp_path / "adapters",
        max_groups=2,
        trainer_model=trainer_model,
    )
    refuse_version_rows(tmp_path / "a.db", True)
    with pytest.raises(Exception, match="version rows refused"):
        trainer.step()  # trained, saved and published v1; then the archive refused its row
    refuse_version_rows(tmp_path / "a.db", False)
    return trainer


def _asked(*servers: LoopbackServer) -> set[str]:
    """The models the servers were asked to sample from since their requests were last cleared."""
    return {model for s in servers for path, model in s.requests if path == "/v1/completions"}


def test_one_server_is_asked_for_the_base_again_and_loads_the_next_version(tiny_search, tmp_path, tiny_model_dir):
    server = LoopbackServer(tiny_model_dir).start()
    try:
        policy = HttpPolicy(server.url, server.model_name, max_wait_s=30)
        trainer = _failed_step(tiny_search, tmp_path, policy, trainer_model=str(tiny_model_dir))
        server.requests.clear()
        group = policy.generate(PROMPT, PARAMS, 2)
        assert _asked(server) == {server.model_name}
        assert policy.version == 0 and {g.version for g in group} == {0}
        assert server.adapters == {}  # the adapter rolled back from is unloaded: the server keeps nothing of it

        trainer.step()  # v1 again, under the name the server had loaded before (vLLM loads a name only once)
        server.requests.clear()
        group = policy.generate(PROMPT, PARAMS, 2)
        assert _asked(server) == {"policy-v1"} and {g.version for g in group} == {1}

        refuse_version_rows(tmp_path / "a.db", True)
        with pytest.raises(Exception, match="version rows refused"):
            trainer.step()  # v2 published, then refused: v1, still loaded on the server, is served again
        server.requests.clear()
        group = policy.generate(PROMPT, PARAMS, 2)
        assert _asked(server) == {"policy-v1"} and {g.version for g in group} == {1} and policy.version == 1
        refuse_version_rows(tmp_path / "a.db", False)
        trainer.step()  # v2 again: a name the server may still hold is loaded afresh
        server.requests.clear()
        group = policy.generate(PROMPT, PARAMS, 2)
        assert _asked(server) == {"policy-v2"} and {g.version for g in group} == {2}
    finally:
        server.stop()


def test_every_one_of_several_servers_is_asked_for_the_base_again(tiny_search, tmp_path, tiny_model_dir):
    a, b = LoopbackServer(tiny_model_dir).start(), LoopbackServer(tiny_model_dir).start()
    try:
        policy = make_policy(f"vllm:{a.url},{b.url}@{a.model_name}")
        assert isinstance(policy, MultiServerPolicy)
        _failed_step(tiny_search, tmp_path, policy, trainer_model=str(tiny_model_dir))
        a.requests.clear()
        b.requests.clear()

        async def groups(count: int) -> list:
            return await asyncio.gather(*(policy.agenerate(PROMPT, PARAMS, 2) for _ in range(count)))

        versions = {g.version for group in asyncio.run(groups(4)) for g in group}
        assert _asked(a) == {a.model_name} and _asked(b) == {b.model_name}  # both sampled, both from the base
        assert versions == {0} and policy.version == 0
        assert {h["version"] for h in policy.health().values()} == {0}
        assert a.adapters == {} and b.adapters == {}
    finally:
        a.stop()
        b.stop()


def _prompt_ids(tokenizer, render) -> list[int]:
    return tokenizer(render(PROMPT), add_special_tokens=False).input_ids


def test_a_llama_model_samples_with_the_base_weights_again(tiny_search, tmp_path, tiny_gguf, tiny_model_dir):
    policy = make_policy(f"llama:{tiny_gguf}")
    try:
        trainer = _failed_step(tiny_search, tmp_path, policy)  # trains a transformers copy, publishes to llama.cpp
        base = TransformersPolicy.load(str(tiny_model_dir))
        prompt_ids = _prompt_ids(base.tokenizer, base.render)
        group = policy.generate(PROMPT, PARAMS, 3)
        assert policy.version == 0 and {g.version for g in group} == {0}
        for g in group:
            gap = (torch.tensor(g.logprobs) - warped_logprobs(base.model, prompt_ids, g.token_ids, PARAMS)).abs()
            assert float(gap.max()) < LOGPROB_BOUND

        trainer.step()
        group = policy.generate(PROMPT, PARAMS, 3)
        assert {g.version for g in group} == {1}
        gaps = [
            float((torch.tensor(g.logprobs) - warped_logprobs(base.model, prompt_ids, g.token_ids, PARAMS)).abs().max())
            for g in group
        ]
        assert max(gaps) > 0.05  # the adapter, once recorded, is what samples
    finally:
        policy.close()
