"""Build a policy from its command-line spec, `backend:argument`."""

from __future__ import annotations

import os
from pathlib import Path

from policies.base import Policy, PolicyError

# Backends whose argument is a file or folder on this machine (transformers' only when it exists: else a hub id).
LOCAL_PATH_BACKENDS = ("replay", "llama", "transformers")


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


def anchored_spec(spec: str, cwd: Path | None = None) -> str:
    """`spec` with a relative file or folder argument made absolute against `cwd` (the working directory).

    A run stores its policy specs and a resume rebuilds the policies from them, maybe from another folder
    (`evolve resume DB` from anywhere): `replay:demo.json` stored as given was looked up there and not found.
    """
    backend, sep, arg = spec.partition(":")
    if not sep or backend not in LOCAL_PATH_BACKENDS or not arg or arg == "embedded" or os.path.isabs(arg):
        return spec
    path = Path(os.path.abspath((cwd or Path.cwd()) / os.path.expanduser(arg)))
    if backend == "transformers" and not path.exists():  # a hub id such as Qwen/Qwen2.5-Coder-0.5B-Instruct
        return spec
    return f"{backend}:{path}"


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
