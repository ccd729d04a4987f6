"""Group advantages: VPO (arXiv 2605.22817), GRPO and Multi-RLVR, behind one `AdvantageEstimator` seam.

Rewards arrive oriented (larger is better) and normalised per component to [0, 1]; failed, unparseable and
duplicate answers are zero rows. VPO scores a completion's *set* of m answers by how well its best answer does
under many random weightings of the components, so a set that covers several trade-offs beats m copies of one
compromise, which is the pressure towards diverse proposals.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

EPS = 1e-6


def _to_numpy(x: Any) -> tuple[np.ndarray, Any]:
    """float64 numpy view of x, and a function that converts a result back to x's kind."""
    if hasattr(x, "detach") and hasattr(x, "device"):  # a torch tensor
        import torch

        like = x
        return x.detach().cpu().double().numpy(), lambda a: torch.as_tensor(a, dtype=like.dtype, device=like.device)
    return np.asarray(x, dtype=np.float64), lambda a: a


def _normalise(scores: np.ndarray) -> np.ndarray:
    std = scores.std()
    if std < EPS:
        return np.zeros_like(scores)
    return (scores - scores.mean()) / (std + EPS)


def simplex_weights(
    num: int, dim: int, *, alpha: float = 1.0, sampler: str = "dirichlet", seed: int | None = None
) -> np.ndarray:
    """(num, dim) weight vectors on the simplex: Dirichlet(alpha) draws, or a scrambled Sobol set mapped there."""
    if sampler == "dirichlet":
        return np.random.default_rng(seed).dirichlet(np.full(dim, alpha), size=num)
    if sampler != "sobol":
        raise ValueError(f"unknown sampler {sampler!r}; use dirichlet or sobol")
    from scipy.stats import gamma, qmc

    points = qmc.Sobol(d=dim, scramble=True, seed=seed).random(num)
    g = gamma.ppf(np.clip(points, 1e-12, 1 - 1e-12), alpha)  # inverse-CDF Gamma(alpha) then normalise = Dirichlet
    return g / g.sum(axis=1, keepdims=True)


def vpo_advantages(
    rewards: Any,
    weights: Any = None,
    *,
    num_weights: int = 100,
    alpha: float = 1.0,
    sampler: str = "dirichlet",
    seed: int | None = None,
) -> Any:
    """rewards (G, m, D) → advantages (G,): R_i = mean_j max_k w_j·r_ik, z-normalised over the group."""
    r, back = _to_numpy(rewards)
    if r.ndim != 3:
        raise ValueError(f"rewards must have shape (G, m, D), got {r.shape}")
    w = (
        simplex_weights(num_weights, r.shape[2], alpha=alpha, sampler=sampler, seed=seed)
        if weights is None
        else _to_numpy(weights)[0]
    )
    if w.ndim != 2 or w.shape[1] != r.shape[2]:
        raise ValueError(f"weights must have shape (W, {r.shape[2]}), got {w.shape}")
    set_reward = np.einsum("gkd,wd->gwk", r, w).max(axis=2).mean(axis=1)
    return back(_normalise(set_reward))


def _component_weights(component_weights: Any, dim: int) -> np.ndarray:
    if component_weights is None:
        return np.full(dim, 1.0 / dim)
    w = _to_numpy(component_weights)[0]
    return w / w.sum()


def grpo_advantages(rewards: Any, component_weights: Any = None) -> Any:
    """rewards (G, D) or (G, 1, D) → (G,): the weighted mean of the components, z-normalised."""
    r, back = _to_numpy(rewards)
    if r.ndim == 3:
        if r.shape[1] != 1:
            raise ValueError(f"GRPO takes one answer per completion; got shape {r.shape} (use m=1)")
        r = r[:, 0, :]
    return back(_normalise(r @ _component_weights(component_weights, r.shape[1])))


def multi_rlvr_advantages(rewards: Any, component_weights: Any = None) -> Any:
    """rewards (G, m, D) → (G,): the set scores as its best answer under one fixed scalarisation."""
    r, back = _to_numpy(rewards)
    return back(_normalise((r @ _component_weights(component_weights, r.shape[2])).max(axis=1)))


class AdvantageEstimator(Protocol):
    name: str

    def __call__(self, rewards: np.ndarray, seed: int | None = None) -> np.ndarray:
        """(G, m, D) oriented, normalised rewards → (G,) advantages."""
        ...


class VPO:
    name = "vpo"

    def __init__(self, num_weights: int = 100, alpha: float = 1.0, sampler: str = "dirichlet") -> None:
        self.num_weights, self.alpha, self.sampler = num_weights, alpha, sampler

    def __call__(self, rewards: np.ndarray, seed: int | None = None) -> np.ndarray:
        return vpo_advantages(rewards, num_weights=self.num_weights, alpha=self.alpha, sampler=self.sampler, seed=seed)


class GRPO:
    """On m > 1 answers a completion scores the mean of its answers' scalar views (documented choice)."""

    name = "grpo"

    def __init__(self, component_weights: np.ndarray | None = None) -> None:
        self.component_weights = component_weights

    def __call__(self, rewards: np.ndarray, seed: int | None = None) -> np.ndarray:
        return grpo_advantages(rewards.mean(axis=1, keepdims=True), self.component_weights)


class MultiRLVR:
    name = "multi-rlvr"

    def __init__(self, component_weights: np.ndarray | None = None) -> None:
        self.component_weights = component_weights

    def __call__(self, rewards: np.ndarray, seed: int | None = None) -> np.ndarray:
        return multi_rlvr_advantages(rewards, self.component_weights)


ESTIMATORS: dict[str, type] = {"vpo": VPO, "grpo": GRPO, "multi-rlvr": MultiRLVR}
METHODS = tuple(ESTIMATORS)  # the training methods' one home: option checks and help texts read it


def make_estimator(method: str) -> AdvantageEstimator:
    if method not in ESTIMATORS:
        raise ValueError(f"unknown method {method!r}; use {', '.join(METHODS[:-1])} or {METHODS[-1]}")
    return ESTIMATORS[method]()
