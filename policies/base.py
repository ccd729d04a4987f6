"""The `Policy` seam: a prompt in, one group of sampled completions out, tagged with the policy version."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

SYSTEM = "You are an expert programmer who improves programs step by step."


class PolicyError(Exception):
    """The policy cannot be loaded or used; `str()` says what to install, start or delete."""


@dataclass(frozen=True)
class SamplingParams:
    """How one group is sampled. No defaults: the engine's come from the problem's `[search]` section."""

    temperature: float
    top_p: float
    max_new_tokens: int
    seed: int | None = None  # None: unseeded
    top_k: int = 0  # 0: no top-k cut
    stop: tuple[str, ...] = ()  # a completion ends once its text holds one of these (kept in the text)

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


# ---- capabilities a policy may offer beyond `Policy`; the engine asks with isinstance, never getattr -------
@runtime_checkable
class AsyncPolicy(Protocol):
    """Samples without a thread: an HTTP policy keeps many groups in flight at once."""

    async def agenerate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]: ...


@runtime_checkable
class PublishingPolicy(Protocol):
    """Serves a new LoRA adapter from `adapter_dir` as policy version `version`, without a restart."""

    def publish(self, adapter_dir: str | os.PathLike[str], version: int) -> None: ...


@runtime_checkable
class Interruptible(Protocol):
    """Can end a generation in flight between two tokens (Ctrl-C, a solved run); its completions come back
    `interrupted`. A request that finds no call in flight ends the next one, unless it is withdrawn."""

    def interrupt(self) -> None: ...

    def withdraw_interrupt(self) -> None: ...


@runtime_checkable
class StatusReporting(Protocol):
    """Has a one-line `status` for the live view ("" when all is well; else e.g. which server it waits for)."""

    status: str


@runtime_checkable
class InProcessPolicy(Protocol):
    """Holds its weights in this process, so the trainer can update them in place."""

    model: Any
    tokenizer: Any

    def render(self, prompt: str) -> str: ...
