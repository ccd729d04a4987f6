"""Build a policy from its command-line spec, `backend:argument`."""

from __future__ import annotations

from pathlib import Path

from policies.policy import Policy, PolicyError
from policies.spec import HTTP_BACKENDS, PolicySpec


def make_policy(spec: str | PolicySpec, *, env_key: bool = True) -> Policy:
    """The policy a spec names (its text is parsed once, `policies/spec.py`). `env_key` False: an HTTP server is
    sent no API key from the environment (a server the user did not name: evolve.members)."""
    parsed = spec if isinstance(spec, PolicySpec) else PolicySpec.parse(spec)
    backend, arg = parsed.backend, parsed.argument
    if backend == "embedded":
        return embedded_policy()
    if backend == "llama":
        from policies.llama_policy import LlamaPolicy

        return LlamaPolicy.load(arg or "embedded")
    if backend == "transformers":
        from policies.transformers_policy import TransformersPolicy

        return TransformersPolicy.load(arg or "embedded")
    if backend in HTTP_BACKENDS:
        from policies.http_policy import HttpPolicy

        servers = [HttpPolicy(url, parsed.model, flavor=backend, env_key=env_key) for url in parsed.urls]
        if len(servers) == 1:
            return servers[0]
        from policies.multi_server import MultiServerPolicy

        return MultiServerPolicy(servers)
    if backend == "vllm-local":
        from policies.vllm_local import VLLMLocalPolicy

        return VLLMLocalPolicy(arg)
    from policies.replay import ReplayPolicy

    return ReplayPolicy.from_file(arg)


def anchored_spec(spec: str, cwd: Path | None = None) -> str:
    """`spec` with a relative file or folder argument made absolute (`PolicySpec.anchored`); a spec that does not
    parse is left as it is, for `make_policy` to refuse in one line."""
    try:
        return str(PolicySpec.parse(spec).anchored(cwd))
    except PolicyError:
        return spec


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
        policy.notes += "; llama-cpp-python is not installed, so not llama.cpp (pip install 'vpo-evolve[llama]')"
        return policy
    from policies.llama_policy import LlamaPolicy

    try:
        return LlamaPolicy.load("embedded")
    except PolicyError as exc:
        policy = TransformersPolicy.load("embedded")
        policy.notes += f"; llama.cpp failed ({exc})"
        return policy


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
