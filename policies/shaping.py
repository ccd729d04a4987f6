"""What makes an update bite on a small model: how a group's rewards are shaped before its advantages, and which
completions enter the batch.

A 0.5B model mostly copies: most of its groups are echoes of the parent and duplicates of known programs, which
are zero rows like failures, so copying costs nothing relative to trying and failing, and a group of copies has
zero spread and so zero advantage. Three options (each stored with the run and with every policy version):

- `skip_zero_advantage` (on by default, as before): a group whose advantages are all zero, and each completion
  whose advantage is zero, stay out of the batch. Off, they enter with advantage 0: no policy gradient of their
  own, but their tokens count in their minibatch's token total (the loss is a mean over tokens), so they scale
  down that minibatch's gradient against the others of the update, they take part in the KL term when one is
  on, and they cost forward and backward passes. (Within one Adam step a uniform scale cancels out; the
  dilution shows across minibatches.)
- `lazy_penalty` (0, off, by default): every answer that gave no new valid program (an echo of the parent, a
  known program repeated, unparseable or missing, a program that failed) gets this reward on every component
  instead of 0. Rewards are in [0, 1], so a negative value ranks each such answer below every valid one, however
  poor: a group of copies and one valid child now has spread, and copying is no longer the safe answer
  (ThetaEvolve's "lazy penalty"). All of them alike, and not copies alone: penalising only copies put a failure
  above a copy, and a GRPO policy trained so (its reward the mean of a completion's answers) learnt to write
  nothing parseable: 0 new valid and 0 copies in 180 variants on minimizer, 3 and 1 in 252 on tour_heuristic,
  where the untrained model wrote 36 and 82, 61 and 122 (benchmarks/best_at_k.py, issue 36). 0 is exactly the
  old behaviour under "bounds" and "group": such an answer is a zero row, the bottom of its group, which group
  normalisation keeps at 0 ("improvement" gives it -WASTE_PENALTY instead, below).
- `reward_normalisation`: "bounds" (the default before issue 61; stored runs keep theirs) leaves the rewards as the
  problem's bounds (or the batch's observed range) put them; "group" then stretches each component to [0, 1] over the
  G x m answers of its own group (min-max, a constant component becomes 0; zero rows included without a lazy penalty,
  over the valid answers alone with one, which then sits below them), so a component whose answers differ by 0.003
  counts as much in the scalarisation as one whose answers differ by 0.5. Over the group rather than over the run so
  far because advantages are group-relative anyway (one parent, one scale), because a run's early spreads (the seed
  against its first children) are far wider than its late ones and would flatten exactly the small late improvements a
  stalled search lives on, and because it needs no state: an online update, an offline `evolve train` and a resumed
  run shape the same group alike.
- `reward_normalisation` "improvement" (the default of new runs, `NORMALISATION`): each answer's reward on component d
  is its child's gain over the group's parent, in units of d's declared range (the batch's observed range where none
  is declared), clipped to [-1, 1]; every answer without a new valid program, and every valid child that scored
  exactly as its parent (a docstring edit, a renamed local: new code, the parent's behaviour), gets -WASTE_PENALTY on
  every component (`lazy_penalty`, when set, instead). Why: "bounds" and "group" pay for a valid answer, not a better
  one. In the closed-loop study's groups, "has any valid answer" alone explained 83-97% of VPO's advantage wherever a
  group mixed valid and wasted completions, and on minimizer most new valid children were docstring edits of their
  parent, each paid like a real child (issue 61). A child that beats its parent now earns more than one that does not,
  and a copy or a docstring edit earns nothing. The penalty is small, the size of a typical gain (see WASTE_PENALTY):
  a wasted answer sits with a child slightly worse than its parent, and one real improvement outweighs it; -0.5
  against gains of 0.01 made "any valid answer" the whole signal.
  Where the parent has no valid evaluation, gains are measured from the bottom of the range (the reward is the
  answer's normalised score).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from policies.training_groups import TrainingGroup

# The shaping defaults, written here once: the trainer's config (policies/trainer.py) and the run's options read
# them (`[training]`, below the policies in the engine's layers, is checked equal by tests/test_options_once.py).
SKIP_ZERO_ADVANTAGE = True
LAZY_PENALTY = 0.0
# "improvement" for new runs since issue 61's replay (docs/training.md): its advantage follows "beat the parent"
# (correlation 0.484 over the study's archives, 0.286 under the study's shaping); a stored run keeps its own.
NORMALISATION = "improvement"
NORMALISATIONS = ("bounds", "group", "improvement")
EPS = 1e-9
# The penalty of a wasted answer under "improvement", per component: about the median gain of the children that
# beat their parent in the closed-loop study's 18 archives (0.0076 of the range; benchmarks/reward_replay.py prints
# it as `median_rise`). There the replay's correlation between VPO's advantage and "beat its parent" is 0.484, within
# 0.012 of its best (0.496 at 0.001) and above 0.443 at 0.04 and 0.415 at 0.1 (docs/training.md). Small, not -0.5:
# a wasted answer ranks below a real attempt without the penalty dwarfing the gains the update should follow.
WASTE_PENALTY = 0.01


@dataclass(frozen=True)
class Selected:
    """One completion that enters the batch, with the advantage its tokens carry."""

    group: int  # index into the groups given
    completion: int  # index into that group's completions
    advantage: float


@dataclass
class Selection:
    """What `select` makes of the groups: the completions that enter the batch, the groups left out by reason,
    and each group's shaped rewards (G x m x D, for the update's statistics)."""

    chosen: list[Selected]
    skipped: Counter[str]
    shaped: list[np.ndarray]


def group_normalise(rewards: np.ndarray, counted: np.ndarray | None = None) -> np.ndarray:
    """(G, m, D) → (G, m, D): each component min-max scaled to [0, 1] over the group's G x m answers, or over the
    `counted` ones of them ((G, m) mask) alone; with none counted, all zeros."""
    flat = rewards.reshape(-1, rewards.shape[-1])
    if counted is not None:
        flat = flat[counted.reshape(-1).astype(bool)]
        if not len(flat):
            return np.zeros_like(rewards)
    lo, hi = flat.min(axis=0), flat.max(axis=0)
    span = hi - lo
    wide = span > EPS
    return np.where(wide, (rewards - lo) / np.where(wide, span, 1.0), 0.0)


def improvement_rewards(
    rewards: np.ndarray,
    wasted: np.ndarray,
    parent: np.ndarray | None,
    unchanged: np.ndarray | None = None,
    penalty: float = WASTE_PENALTY,
) -> np.ndarray:
    """(G, m, D) rewards on the range's unit scale, the (G, m) wasted and unchanged masks and the parent's (D,)
    vector on the same scale → each answer's gain over the parent, clipped to [-1, 1]; wasted and unchanged
    answers get -penalty on every component."""
    base = np.zeros(rewards.shape[-1]) if parent is None else np.asarray(parent, dtype=np.float64)
    gains = np.clip(rewards - base, -1.0, 1.0)
    waste = wasted.astype(bool) if unchanged is None else wasted.astype(bool) | unchanged.astype(bool)
    gains[waste] = -abs(penalty)
    return gains


def shape_rewards(
    rewards: np.ndarray,
    wasted: np.ndarray,
    *,
    normalisation: str = NORMALISATION,
    lazy_penalty: float = LAZY_PENALTY,
    parent: np.ndarray | None = None,
    unchanged: np.ndarray | None = None,
) -> np.ndarray:
    """(G, m, D) rewards in [0, 1] and the (G, m) mask of answers without a new valid program → the rewards
    advantages see. `parent` and `unchanged` are read by "improvement" alone."""
    if normalisation not in NORMALISATIONS:
        choices = ", ".join(NORMALISATIONS[:-1]) + f" or {NORMALISATIONS[-1]}"
        raise ValueError(f"unknown reward normalisation {normalisation!r}; use {choices}")
    if normalisation == "improvement":
        return improvement_rewards(rewards, wasted, parent, unchanged, lazy_penalty or WASTE_PENALTY)
    # With a penalty, the stretch is over the valid answers alone: the wasted ones are overwritten below, and
    # their zero rows kept in it would squeeze the valid answers (0.90 and 0.91 stretched to 0.989 and 1.0).
    counted = ~wasted.astype(bool) if lazy_penalty else None
    shaped = group_normalise(rewards, counted) if normalisation == "group" else rewards.copy()
    if lazy_penalty:
        shaped[wasted.astype(bool)] = lazy_penalty
    return shaped


def select(
    groups: Sequence[TrainingGroup],
    estimator: Callable[..., np.ndarray],
    seeds: Callable[[], int],
    *,
    skip_zero_advantage: bool = SKIP_ZERO_ADVANTAGE,
    normalisation: str = NORMALISATION,
    lazy_penalty: float = LAZY_PENALTY,
) -> Selection:
    """The completions that enter the batch with their advantages (see `Selection`). `seeds()` gives one
    estimator seed per group."""
    chosen: list[Selected] = []
    skipped: Counter[str] = Counter()
    shaped_all = []
    for gi, g in enumerate(groups):
        shaped = shape_rewards(
            g.rewards(),
            g.wasted(),
            normalisation=normalisation,
            lazy_penalty=lazy_penalty,
            parent=g.parent,
            unchanged=g.unchanged(),
        )
        shaped_all.append(shaped)
        adv = np.asarray(estimator(shaped, seed=seeds()), dtype=np.float64)
        if np.all(adv == 0):
            if skip_zero_advantage:
                skipped["all advantages zero"] += 1
                continue
            skipped["all advantages zero (kept)"] += 1
        for ci, a in enumerate(adv):
            if a != 0 or not skip_zero_advantage:
                chosen.append(Selected(gi, ci, float(a)))
    return Selection(chosen, skipped, shaped_all)
