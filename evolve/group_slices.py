"""Which groups one update learns from, when it should not learn from them all: an offline experiment on a fixed
archive (benchmarks/improve_at_k.py) takes, per update, a few of the groups whose completions the reward tells
apart, so that an update costs what an online one does (a few groups) and 30 of them fit this CPU machine."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from policies.advantages import make_estimator
from policies.shaping import shape_rewards
from policies.trainer import TrainConfig
from policies.training_groups import TrainingGroup

JUDGES = (make_estimator("vpo"), make_estimator("grpo"))


def spread(group: TrainingGroup, config: TrainConfig) -> bool:
    """Whether some completion of the group gets an advantage under VPO or GRPO with the config's shaping: the
    estimators themselves decide (answers in another order, or gains below their 1e-6 floor, look different to
    a plain comparison and teach nothing). The same groups are offered to every method; one that is flat for
    GRPO alone (a trade-off its mean cannot see) still teaches VPO."""
    shaped = shape_rewards(
        group.rewards(),
        group.wasted(),
        normalisation=config.reward_normalisation,
        lazy_penalty=config.lazy_penalty,
        parent=group.parent,
        unchanged=group.unchanged(),
    )
    return any(np.any(np.asarray(judge(shaped, seed=0)) != 0) for judge in JUDGES)


def step_slice(step: int, per_step: int, order_seed: int, config: TrainConfig):
    """A pick (evolve.training.GroupPick) for update `step`: `per_step` of the groups with spread, in an order
    drawn from `order_seed` over their prompt ids (so every method trained with that seed sees the same groups at
    the same step, whatever order they were loaded in), taken in turn and wrapping round."""

    def pick(groups: list[TrainingGroup]) -> list[TrainingGroup]:
        usable = sorted((g for g in groups if spread(g, config)), key=lambda g: g.prompt_id)
        if not usable:
            return []
        order = np.random.default_rng(order_seed).permutation(len(usable))
        return [usable[order[(step * per_step + j) % len(usable)]] for j in range(min(per_step, len(usable)))]

    return pick


@dataclass
class StepProgress:
    """Which update a training resumes at. A step whose slice taught nothing saves no version, so the versions
    alone would replay a slice after a restart (and put methods out of step); the file records the steps done and
    how many versions existed then, and a version newer than the file is a step that ended after its record."""

    path: Path

    def next_step(self, versions: int) -> int:
        if not self.path.is_file():
            return versions  # every step before this file existed saved a version
        seen = json.loads(self.path.read_text())
        return seen["steps"] + (1 if versions > seen["versions"] else 0)

    def record(self, step: int, versions: int) -> None:
        staging = self.path.with_name(self.path.name + ".partial")
        staging.write_text(json.dumps({"steps": step + 1, "versions": versions}))
        staging.rename(self.path)
