"""Policy versions are transactional: the version row, its adapter directory, the served weights and the
optimizer state change together or not at all. Failures are real ones: the archive's SQLite database refuses
the version row (a trigger), after the adapter was written and published."""

from __future__ import annotations

import math
import sqlite3

import pytest
import torch

from evolve.archive import Archive
from evolve.training import ArchiveTrainer
from policies.policy import SamplingParams
from policies.trainer import TrainConfig
from policies.transformers_policy import TransformersPolicy
from tests.helpers import refuse_version_rows

pytestmark = pytest.mark.slow
PROBE = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=40, seed=21)


def _state(trainer: ArchiveTrainer) -> tuple[dict, dict]:
    from peft import get_peft_model_state_dict

    weights = {k: v.detach().clone() for k, v in get_peft_model_state_dict(trainer.trainer.model).items()}
    optimizer = {
        (p, k): v.clone() if torch.is_tensor(v) else v
        for p, s in trainer.trainer.optimizer.state_dict()["state"].items()
        for k, v in s.items()
    }
    return weights, optimizer


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)


def _probe(policy) -> list[tuple[list[int], list[float]]]:
    return [(g.token_ids, g.logprobs) for g in policy.generate("Square the input.", PROBE, 2)]


def _versions(db) -> list[tuple[int, str | None]]:
    con = sqlite3.connect(db)
    rows = con.execute("SELECT number, adapter_path FROM policy_versions ORDER BY number").fetchall()
    con.close()
    return rows


def test_a_refused_version_row_undoes_the_adapter_the_publish_and_the_optimizer_step(
    tmp_path, tiny_model_dir, tiny_search
):
    policy = TransformersPolicy.load(str(tiny_model_dir))
    adapters, db = tmp_path / "adapters", tiny_search.copy_to(tmp_path / "a.db")
    config = TrainConfig(learning_rate=1e-3, lora_rank=4)
    trainer = ArchiveTrainer(Archive(db), tiny_search.run_id, tiny_search.components, 2, policy, config, adapters)
    probe = _probe(policy)  # the base model's tokens and logprobs
    base = _state(trainer)
    assert base[1] == {}  # no optimizer step yet

    refuse_version_rows(db, True)
    with pytest.raises(Exception, match="version rows refused"):
        trainer.step()  # trained, saved and published; then the archive refused the row
    assert _versions(db) == [(0, None)] and policy.version == 0
    assert not adapters.exists() or list(adapters.iterdir()) == []
    weights, optimizer = _state(trainer)
    assert _same(weights, base[0]) and optimizer == {}
    assert _probe(policy) == probe  # the base model again: the same tokens with the same logprobs

    refuse_version_rows(db, False)
    stats = trainer.step()
    assert stats.samples > 0 and policy.version == 1
    assert _versions(db) == [(0, None), (1, str(adapters / "v1"))]
    assert sorted(p.name for p in adapters.iterdir()) == ["v1"]
    v1 = _state(trainer)
    assert v1[1] and not _same(v1[0], base[0])
    probe_v1 = _probe(policy)
    assert probe_v1 != probe

    refuse_version_rows(db, True)
    with pytest.raises(Exception, match="version rows refused"):
        trainer.step()
    assert _versions(db) == [(0, None), (1, str(adapters / "v1"))] and policy.version == 1
    assert sorted(p.name for p in adapters.iterdir()) == ["v1"]
    weights, optimizer = _state(trainer)
    assert _same(weights, v1[0]) and _same(optimizer, v1[1])
    assert _probe(policy) == probe_v1  # v1 served again

    refuse_version_rows(db, False)
    trainer.step()
    assert [n for n, _ in _versions(db)] == [0, 1, 2] and policy.version == 2  # no number skipped or reused


def test_an_update_abandoned_between_samples_leaves_no_trace_and_the_next_step_trains(
    tmp_path, tiny_model_dir, tiny_search
):
    """The run is stopping (Ctrl-C, SIGTERM): the trainer gives the update up at the next group, here after two
    optimizer steps had moved the weights, and the step rolls back as after any failure."""
    from policies.trainer import UpdateAbandoned

    policy = TransformersPolicy.load(str(tiny_model_dir))
    adapters, db = tmp_path / "adapters", tiny_search.copy_to(tmp_path / "a.db")
    config = TrainConfig(learning_rate=1e-3, lora_rank=4, minibatch=2, skip_zero_advantage=False)
    trainer = ArchiveTrainer(Archive(db), tiny_search.run_id, tiny_search.components, 2, policy, config, adapters)
    probe, base = _probe(policy), _state(trainer)
    # Asked before each group's pass (the old logprobs first, then each minibatch's groups): given up at the first
    # ask after two optimizer steps, so the weights had moved. (How many groups the fixture's search made depends
    # on its timing; nothing here counts on it.)
    steps_when_asked: list[int] = []

    def stop_after_two_steps() -> bool:
        state = trainer.trainer.optimizer.state_dict()["state"]
        steps_when_asked.append(max((int(s["step"]) for s in state.values()), default=0))
        return steps_when_asked[-1] >= 2

    with pytest.raises(UpdateAbandoned):
        trainer.step(stop_after_two_steps)
    assert steps_when_asked[-1] == 2 and steps_when_asked.count(2) == 1  # given up at once, the weights had moved
    assert _versions(db) == [(0, None)] and policy.version == 0
    assert not adapters.exists() or list(adapters.iterdir()) == []
    weights, optimizer = _state(trainer)
    assert _same(weights, base[0]) and optimizer == {}
    assert _probe(policy) == probe

    stats = trainer.step()  # what was abandoned trains whole next time: every minibatch of every sample
    assert stats.samples >= 4 and stats.optimizer_steps == math.ceil(stats.samples / 2) and policy.version == 1
    assert _versions(db) == [(0, None), (1, str(adapters / "v1"))]
