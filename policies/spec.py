"""A policy spec, `backend:argument`, parsed once into a typed value.

The command line, `[[search.policies]]` and a stored run all name a policy by its spec text (`embedded`,
`llama:PATH.gguf`, `vllm:URL1,URL2@MODEL`, ...). It is parsed here, once, into a `PolicySpec`: the backend, its
argument, and for the HTTP backends the server URLs and the model. `make_policy` builds from it, `anchored`
makes a local path absolute for storing, and the text form round-trips (`str(PolicySpec.parse(t)) == t`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

from policies.policy import PolicyError

BACKENDS = ("embedded", "llama", "transformers", "vllm", "openai", "vllm-local", "replay")
HTTP_BACKENDS = ("vllm", "openai")
# Backends whose argument is a file or folder on this machine (transformers' only when it exists: else a hub id).
LOCAL_PATH_BACKENDS = ("replay", "llama", "transformers")
EMBEDDED_ARGUMENTS = ("embedded", "embedded-1.5b")  # the shipped models a local backend names, not files
USAGE = (
    "use embedded, llama:embedded, llama:embedded-1.5b, llama:PATH.gguf, transformers:embedded, "
    "transformers:DIR_OR_HUB_ID, vllm:URL[@MODEL], vllm:URL1,URL2,...[@MODEL], openai:URL@MODEL, vllm-local:MODEL "
    "or replay:FILE"
)


@dataclass(frozen=True)
class PolicySpec:
    backend: str
    argument: str = ""
    urls: tuple[str, ...] = ()  # the HTTP backends' servers, in order
    model: str | None = None  # the HTTP backends' model, after `@`

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """The spec's parts; an unknown backend or a malformed HTTP argument is a `PolicyError` saying the form."""
        if text == "embedded":
            return cls("embedded")
        backend, sep, argument = text.partition(":")
        if not sep or backend not in BACKENDS or backend == "embedded":
            raise PolicyError(f"unknown policy {text!r}; {USAGE}")
        if backend not in HTTP_BACKENDS:
            return cls(backend, argument)
        servers, _at, model = argument.rpartition("@") if "@" in argument else (argument, "", "")
        urls = tuple(u.strip() for u in servers.split(",") if u.strip())
        example = f"{backend}:http://127.0.0.1:8000@MODEL"
        if not urls or not all(u.startswith(("http://", "https://")) for u in urls):
            raise PolicyError(f"{text}: give base URLs such as {example}")
        if backend == "openai" and not model:
            raise PolicyError(f"{text}: name the model, as openai:{servers}@MODEL")
        return cls(backend, argument, urls, model or None)

    def __str__(self) -> str:
        return "embedded" if self.backend == "embedded" else f"{self.backend}:{self.argument}"

    @property
    def local_path(self) -> str | None:
        """The file or folder on this machine the spec may name, as written (a transformers argument may be a hub
        id instead), or None: what a spec from a problem folder must keep inside that folder."""
        arg = self.argument
        return arg if self.backend in LOCAL_PATH_BACKENDS and arg and arg not in EMBEDDED_ARGUMENTS else None

    def anchored(self, cwd: Path | None = None) -> PolicySpec:
        """The spec with a relative file or folder argument made absolute against `cwd` (the working directory).

        A run stores its policy specs and a resume rebuilds the policies from them, maybe from another folder
        (`evolve resume DB` from anywhere): `replay:demo.json` stored as given was looked up there and not found.
        """
        arg = self.argument
        if self.backend not in LOCAL_PATH_BACKENDS or not arg or arg in EMBEDDED_ARGUMENTS or os.path.isabs(arg):
            return self
        path = Path(os.path.abspath((cwd or Path.cwd()) / os.path.expanduser(arg)))
        if self.backend == "transformers" and not path.exists():  # a hub id such as Qwen/Qwen2.5-Coder-0.5B-Instruct
            return self
        return replace(self, argument=str(path))
