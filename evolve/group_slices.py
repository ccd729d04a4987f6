"""Which groups one update learns from, when it should not learn from them all: an offline experiment on a fixed
archive (benchmarks/improve_at_k.py) takes, per update, a few of the groups whose completions the reward tells
apart, so that an update costs what an online one does (a few groups) and 30 of them fit this CPU machine."""

from __future__ import annotations

import numpy as np

from policies.shaping import shape_rewards
from policies.trainer import TrainConfig
from policies.training_groups import TrainingGroup


def spread(group: TrainingGroup, config: TrainConfig) -> bool:
    """Whether the group's completions differ under the config's shaping: a group whose completions all earn
    alike gives every method a zero advantage (VPO's and GRPO's both), so it teaches nothing."""
    shaped = shape_rewards(
        group.rewards(),
        group.wasted(),
        normalisation=config.reward_normalisation,
        lazy_penalty=config.lazy_penalty,
        parent=group.parent,
        unchanged=group.unchanged(),
    )
    return not np.allclose(shaped, shaped[0], atol=1e-9)


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
