"""The `Policy` seam: a prompt in, one group of sampled completions out, tagged with the policy version."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

SYSTEM = "You are an expert programmer who improves programs step by step."


class PolicyError(Exception):
    """The policy cannot be loaded or used; `str()` says what to install, start or delete."""


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_p: float = 0.95
    max_new_tokens: int = 768
    seed: int | None = None
    top_k: int = 0  # 0: no top-k cut

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Generated:
    """One completion as sampled. `logprobs` are those of the distribution each token was drawn from (after
    temperature, top-k and top-p): the behaviour policy the trainer's importance weight divides by."""

    text: str
    token_ids: list[int] | None
    logprobs: list[float] | None
    finish_reason: str | None
    version: int


@runtime_checkable
class Policy(Protocol):
    """A model whose `version` may change during a run (when a new adapter is published)."""

    name: str
    version: int
    max_concurrency: int

    def generate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]: ...

    def close(self) -> None: ...
