"""The `Policy` seam: a prompt in, one group of sampled completions out, tagged with the policy version."""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from policies.answer_grammar import AnswerShape

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
    # The answer's shape the prompt asked for, enforced while sampling by a policy that can (`StructuredSampling`);
    # None: free text. Ignored by a policy that cannot: the engine asks before it sets it.
    structured: AnswerShape | None = None
    # Codes the answer's fenced blocks should not write again (the parent, the programs shown, the parent's newest
    # children: `policies/copy_guard.py`), for a policy that guards against copies; () for none. Stored as a count.
    avoid: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"avoid": len(self.avoid)}


_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Generated:
    """One completion as sampled. `logprobs` are those of the distribution each token was drawn from (after
    temperature, top-k and top-p): the behaviour policy the trainer's importance weight divides by."""

    text: str
    token_ids: list[int] | None
    logprobs: list[float] | None
    finish_reason: str | None
    version: int

    def __post_init__(self) -> None:
        # A backend that decodes JSON can hand back a lone surrogate ("\\ud800"): no UTF-8 writer (the archive,
        # the sandbox's files) takes one, so it becomes U+FFFD here, where every completion enters the engine.
        if not self.text.isascii():
            object.__setattr__(self, "text", _SURROGATE.sub("\ufffd", self.text))


def render_chat(tokenizer: Any, prompt: str) -> str:
    """The prompt as the model's chat template lays it out (system, then user), or as is without a template."""
    if getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return prompt


def chat_token_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The ids of the prompt laid out by the chat template: what every in-process backend samples from."""
    return tokenizer(render_chat(tokenizer, prompt), add_special_tokens=False).input_ids


@dataclass
class SamplingProgress:
    """The group being sampled, as the sampling thread updates it and the live view reads it (plain counters:
    a reader may see one a step behind, never a torn value)."""

    rows: int = 0
    rows_done: int = 0
    tokens: int = 0
    budget: int = 0  # rows × max_new_tokens: the most this call can sample
    prompt_tokens: int = 0  # prompt tokens this call decodes (those cached from the previous group excluded)
    started: float = field(default_factory=time.monotonic)
    active: bool = False

    def start(self, rows: int, max_new_tokens: int, prompt_tokens: int) -> None:
        self.rows, self.rows_done, self.tokens, self.budget = rows, 0, 0, rows * max_new_tokens
        self.prompt_tokens, self.started, self.active = prompt_tokens, time.monotonic(), True

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    def line(self) -> str:
        """E.g. `sampling 4 rows: 312 tokens, 9.8 tok/s, 1/4 rows done, 31 s`."""
        if not self.active:
            return ""
        elapsed = self.elapsed_s
        if not self.tokens:
            return f"sampling {self.rows} rows: reading the prompt ({self.prompt_tokens} new tokens), {elapsed:.0f} s"
        return (
            f"sampling {self.rows} rows: {self.tokens} tokens, {self.tokens / max(elapsed, 1e-9):.1f} tok/s, "
            f"{self.rows_done}/{self.rows} rows done, {elapsed:.0f} s"
        )

    def bar(self, width: int = 24) -> str:
        """Tokens sampled against the most this call can sample, e.g. `[######..........]`."""
        filled = min(width, round(width * self.tokens / self.budget)) if self.budget else 0
        return "[" + "#" * filled + "." * (width - filled) + "]"


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
    """Serves a new LoRA adapter from `adapter_dir` as policy version `version`, without a restart, and can
    serve its base model again (a training step that fails after its publish rolls back to the base this way).

    Each method sets the policy's own `version` (and that of every server behind it), so that the completions
    sampled afterwards carry the version of the weights that really sampled them."""

    version: int

    def publish(self, adapter_dir: str | os.PathLike[str], version: int) -> None: ...

    def serve_base(self, version: int) -> None:
        """Sample from the base model again, without any adapter, as policy version `version`."""
        ...


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
class StructuredSampling(Protocol):
    """Holds every row to `SamplingParams.structured` while sampling (a grammar's mask on each token), for the
    edit formats in `structured_formats`; the stored logprobs are then those of the masked distribution."""

    structured_formats: tuple[str, ...]


@runtime_checkable
class Describing(Protocol):
    """Says in a few words how it samples (runtime, precision, threads), for the run's opening lines."""

    @property
    def description(self) -> str: ...


@runtime_checkable
class ProgressReporting(Protocol):
    """Counts the tokens of the group it is sampling as they come (the live view shows them)."""

    progress: SamplingProgress


@runtime_checkable
class TrainsAsTransformers(Protocol):
    """Samples with a runtime the trainer cannot update (llama.cpp), but from a base model that transformers
    can load from `trainer_model`: the trainer trains that copy and publishes its adapters back here."""

    trainer_model: str


@runtime_checkable
class InProcessPolicy(Protocol):
    """Holds its weights in this process, so the trainer can update them in place."""

    model: Any
    tokenizer: Any

    def render(self, prompt: str) -> str: ...
