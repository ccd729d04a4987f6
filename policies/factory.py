"""Build a policy from its command-line spec, `backend:argument`."""

from __future__ import annotations

from policies.base import Policy, PolicyError


def make_policy(spec: str) -> Policy:
    backend, _, arg = spec.partition(":")
    if spec == "embedded":
        return embedded_policy()
    if backend == "llama":
        from policies.llama_policy import LlamaPolicy

        return LlamaPolicy.load(arg or "embedded")
    if backend == "transformers":
        from policies.transformers_policy import TransformersPolicy

        return TransformersPolicy.load(arg or "embedded")
    if backend in ("vllm", "openai") and "," in arg:
        from policies.multi_server import parse_servers

        return parse_servers(backend, arg)
    if backend in ("vllm", "openai"):
        from policies.http_policy import parse_spec

        return parse_spec(backend, arg)
    if backend == "vllm-local":
        from policies.vllm_local import VLLMLocalPolicy

        return VLLMLocalPolicy(arg)
    if backend == "replay":
        from policies.replay import ReplayPolicy

        return ReplayPolicy.from_file(arg)
    raise PolicyError(
        f"unknown policy {spec!r}; use embedded, llama:embedded, llama:PATH.gguf, transformers:embedded, "
        "transformers:DIR_OR_HUB_ID, vllm:URL[@MODEL], "
        "vllm:URL1,URL2,...[@MODEL], openai:URL@MODEL, vllm-local:MODEL or replay:FILE"
    )


def embedded_policy() -> Policy:
    """The embedded model on the fastest backend this machine has: llama.cpp on a CPU when llama-cpp-python
    imports (several times the tokens per second of transformers there), else transformers (on a GPU, or as
    the fallback). Its `description` says which, and why."""
    import importlib.util

    from policies.transformers_policy import TransformersPolicy

    if _has_cuda():
        return TransformersPolicy.load("embedded")
    if importlib.util.find_spec("llama_cpp") is None:
        policy = TransformersPolicy.load("embedded")
        policy.description += "; llama-cpp-python is not installed, so not llama.cpp (pip install 'vpo-evolve[llama]')"
        return policy
    from policies.llama_policy import LlamaPolicy

    try:
        return LlamaPolicy.load("embedded")
    except PolicyError as exc:
        policy = TransformersPolicy.load("embedded")
        policy.description += f"; llama.cpp failed ({exc})"
        return policy


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
