"""Build a policy from its command-line spec, `backend:argument`."""

from __future__ import annotations

from policies.base import Policy, PolicyError


def make_policy(spec: str) -> Policy:
    backend, _, arg = spec.partition(":")
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
        f"unknown policy {spec!r}; use transformers:embedded, transformers:DIR_OR_HUB_ID, vllm:URL[@MODEL], "
        "vllm:URL1,URL2,...[@MODEL], openai:URL@MODEL, vllm-local:MODEL or replay:FILE"
    )
