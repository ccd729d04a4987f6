"""Policies behind an HTTP server: `vllm:BASE_URL[@MODEL]` and `openai:BASE_URL@MODEL`.

vLLM: the prompt is rendered and tokenised by the server's own chat template (`POST /tokenize`), then sampled
through `/v1/completions` from those token ids, with the sampled token ids and their logprobs returned, so
what the trainer reads lines up token for token. Start the server with `--logprobs-mode processed_logprobs`
(vLLM >= 0.10.2; it is a server flag, not a request field): without it vLLM returns the raw model's logprobs,
before temperature, top-k and top-p, not those of the behaviour policy the trainer's importance weight needs.
Every request names temperature, top-p and top-k explicitly, so the model's `generation_config` defaults
(vLLM applies them to whatever a request leaves out) never change the distribution sampled from. New LoRA
adapters are loaded with `/v1/load_lora_adapter` under a name per version; requests then name that adapter.
A group asked for in the answer's shape carries its GBNF grammar in the field the server was found to read
(`structured_outputs.grammar`, or `guided_grammar` before vLLM 0.10.2: policies/http_grammar.py). vLLM masks
the logits with the grammar before its sampler, so a processed logprob is then that of the masked distribution
warped by temperature, top-k and top-p (mask first, then warp; the llama policy warps first, then masks): still
exactly the distribution the token was drawn from.

OpenAI-compatible (SGLang, llama.cpp, hosted APIs): chat completions; logprobs are kept where the server
gives them (llama-cpp-python's are the model's raw ones, before temperature, top-k, top-p and any grammar);
token ids are not, so such completions are searched with but never trained on. A server found to keep to
llama.cpp's GBNF `grammar` field (llama.cpp's, llama-cpp-python's) is sent each group's answer shape as a
grammar, and its own sampler defaults (top-k 40, min-p 0.05, a repeat penalty of 1.1) are overridden by the
group's settings; any other is sent the plain prompt. A server that returns one choice where n were asked
(llama-cpp-python ignores `n`) is asked n times, each with its own seed. A stop string the server cut from the
text is put back when its tokens (the logprobs' `token` texts) show it was sampled, as `SamplingParams.stop`
promises.

Which grammar field a server reads is asked once, before its first group (`structured_formats`, asked by the
engine for its opening lines): a tiny request under a tiny grammar (`_probe`, policies/http_grammar.py); a server
that keeps to none of its flavor's fields is sent the plain prompt, and the run's opening lines say so.

Transient failures (connection refused, timeouts, 5xx, malformed JSON) are retried with capped exponential
backoff for up to `max_wait_s`; a 4xx (a wrong model name, say) is reported at once.

The API key (`Authorization: Bearer`) is `api_key`, else EVOLVE_API_KEY or OPENAI_API_KEY from the environment
unless `env_key` is False: a server named by a problem folder rather than by the user is built so
(evolve.members), since the key is the user's and the folder may name any server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import random
import threading
import time
from typing import Any

import httpx

from policies.answer_grammar import EDIT_FORMATS, answer_gbnf
from policies.http_grammar import CHAT, FIELDS, GrammarField, kept_to_probe, probe_request, probe_texts
from policies.policy import SYSTEM, Generated, PolicyError, SamplingParams


class _Retryable(Exception):
    pass


class _Refused(PolicyError):
    """A 4xx: the server understood the request and will not answer it (retrying would not help)."""


class HttpPolicy:
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        flavor: str = "vllm",
        api_key: str | None = None,
        env_key: bool = True,
        concurrency: int = 4,
        timeout_s: float = 600.0,
        max_wait_s: float = 900.0,
    ) -> None:
        if flavor not in ("vllm", "openai"):
            raise PolicyError(f"unknown HTTP policy flavor {flavor!r}")
        # Hosted APIs document their base URL with its `/v1` (https://api.openai.com/v1); the paths below add it.
        self.base_url, self.flavor = base_url.rstrip("/").removesuffix("/v1"), flavor
        from_env = (os.environ.get("EVOLVE_API_KEY") or os.environ.get("OPENAI_API_KEY")) if env_key else None
        self.api_key = api_key or from_env
        self.timeout_s, self.max_wait_s = timeout_s, max_wait_s
        self.max_concurrency = concurrency
        self._model = model
        self.served = model  # the model name requests use: the base, or the newest adapter
        self.version = 0
        self.status = ""
        self._adapters: list[str] = []
        self._lock = threading.Lock()
        self.name = f"{flavor}:{self.base_url}@{model or '?'}"
        # The probe (`_probe`): None until asked, then whether the server keeps to a GBNF grammar, sent in which
        # field (why not, in `grammar_note`), and whether it answers one choice where n were asked.
        self.takes_grammar: bool | None = None
        self.grammar_field: GrammarField | None = None
        self.one_choice: bool | None = None
        self.grammar_note = ""
        self._probe_lock = threading.Lock()

    # ---- transport --------------------------------------------------------------------------------------
    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _check(self, url: str, response: httpx.Response) -> Any:
        if response.status_code >= 500:
            raise _Retryable(f"HTTP {response.status_code}")
        if response.status_code >= 400:
            raise _Refused(
                f"{url}: HTTP {response.status_code}: {response.text[:300]}; check the model name "
                f"(--policy {self.flavor}:{self.base_url}@MODEL) and the server's flags"
            )
        try:
            return response.json()
        except ValueError:
            raise _Retryable("malformed JSON") from None

    async def _post(self, path: str, payload: dict[str, Any]) -> Any:
        return await self._request("POST", path, payload)

    async def _request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        url, start, attempt = f"{self.base_url}{path}", time.monotonic(), 0
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self._headers()) as client:
            while True:
                try:
                    body = self._check(url, await client.request(method, url, json=payload))
                    self.status = ""
                    return body
                except (httpx.TransportError, _Retryable) as exc:
                    waited = time.monotonic() - start
                    if waited > self.max_wait_s:
                        raise PolicyError(
                            f"{url}: no usable answer for {waited:.0f}s ({exc}); is the server "
                            "up? (see docs/policies.md)"
                        ) from None
                    delay = min(30.0, 0.25 * 2**attempt) * (0.5 + random.random())
                    self.status = f"waiting for {self.base_url} ({type(exc).__name__}: {exc}); retry in {delay:.1f}s"
                    attempt += 1
                    await asyncio.sleep(delay)

    async def _base_model(self) -> str:
        if self._model is None:
            models = await self._request("GET", "/v1/models")
            try:
                self._model = models["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                raise PolicyError(
                    f"{self.base_url}/v1/models lists no model; pass --policy {self.flavor}:{self.base_url}@MODEL"
                ) from None
            self.served = self.served or self._model
            self.name = f"{self.flavor}:{self.base_url}@{self._model}"
        return self._model

    # ---- sampling ---------------------------------------------------------------------------------------
    def _messages(self, prompt: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]

    async def agenerate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]:
        base = await self._base_model()
        with self._lock:
            served, version = self.served or base, self.version
        sampling = {
            "n": n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_new_tokens,
            "seed": params.seed,
        }
        if params.stop:  # vLLM keeps the stop string in the text with its flag; an OpenAI server drops it (and
            # rejects unknown flags), and the parser reads an unclosed last variant all the same
            sampling["stop"] = list(params.stop)
            if self.flavor == "vllm":
                sampling["include_stop_str_in_output"] = True
        if self.flavor == "openai":
            return await self._chat(served, prompt, params, sampling, n, version)
        if params.structured is not None:
            if self.takes_grammar is None:
                await asyncio.to_thread(self._probe)
            if self.grammar_field is not None:
                sampling.update(self.grammar_field.payload(answer_gbnf(params.structured)))
        tokens = await self._post(
            "/tokenize", {"model": base, "messages": self._messages(prompt), "add_generation_prompt": True}
        )
        if not isinstance(tokens, dict) or not isinstance(tokens.get("tokens"), list):
            raise PolicyError(f"{self.base_url}/tokenize gave no tokens; is this a vLLM server?")
        body = await self._post(
            "/v1/completions",
            {
                "model": served,
                "prompt": tokens["tokens"],
                "logprobs": 0,
                "return_tokens_as_token_ids": True,
                "top_k": params.top_k if params.top_k > 0 else -1,  # explicit, or vLLM applies the model's default
                **sampling,
            },
        )
        return [self._completion_choice(c, version) for c in self._choices(body, n)]

    def _choices(self, body: Any, n: int) -> list[dict[str, Any]]:
        choices = body.get("choices") if isinstance(body, dict) else None
        if not isinstance(choices, list) or len(choices) != n:
            raise PolicyError(f"{self.base_url}: expected {n} choices, got {body!r:.200}")
        return sorted(choices, key=lambda c: c.get("index", 0))

    @staticmethod
    def _completion_choice(choice: dict[str, Any], version: int) -> Generated:
        lp = choice.get("logprobs") or {}
        ids = choice.get("token_ids")
        if ids is None and lp.get("tokens") and all(str(t).startswith("token_id:") for t in lp["tokens"]):
            ids = [int(str(t).split(":", 1)[1]) for t in lp["tokens"]]
        logprobs = lp.get("token_logprobs")
        if ids is None or logprobs is None or len(ids) != len(logprobs):
            ids, logprobs = None, None
        return Generated(str(choice.get("text", "")), ids, logprobs, choice.get("finish_reason"), version)

    # ---- a grammar, where the server keeps to one ---------------------------------------------------------
    @property
    def structured_formats(self) -> tuple[str, ...]:
        """`StructuredSampling`: the edit formats whose answer shape is sent to the server as a GBNF grammar. None
        for a server that kept to no grammar when asked once (`_probe`): the engine then sends the plain prompt
        and its opening lines say so."""
        self._probe()
        return EDIT_FORMATS if self.takes_grammar else ()

    def _probe(self) -> None:
        """Once: a tiny request (n=2) under a tiny grammar, in each field this flavor's servers may read, in turn
        (policies/http_grammar.py), until an answer keeps to it. A field ignored (free text) or refused (a 4xx)
        is noted and the next one tried; none kept: no grammar. The first answer's number of choices says
        whether the server honours `n`. Transient failures are retried as for any request; a server that never
        answers is taken as one without grammars (its groups then fail as usual)."""
        with self._probe_lock:
            if self.takes_grammar is not None:
                return
            notes = []
            for field in FIELDS[self.flavor]:
                try:
                    texts = probe_texts(_blocking(lambda f=field: self._probe_request(f)))
                except _Refused as exc:
                    notes.append(f"`{field.name}` refused ({exc})")
                    continue
                except PolicyError as exc:
                    notes.append(f"the probe failed ({exc})")
                    break
                if self.one_choice is None:
                    self.one_choice = len(texts) == 1
                if kept_to_probe(texts):
                    self.takes_grammar, self.grammar_field = True, field
                    return
                notes.append(f"the server answered {texts[:1]!r} outside a GBNF grammar sent as `{field.name}`")
            self.takes_grammar, self.grammar_note = False, "no grammar: " + "; ".join(notes)

    async def _probe_request(self, field: GrammarField) -> Any:
        return await self._post(*probe_request(self.flavor, self.served or await self._base_model(), field))

    # ---- the openai flavor: chat completions ---------------------------------------------------------------
    async def _chat(
        self, served: str, prompt: str, params: SamplingParams, sampling: dict[str, Any], n: int, version: int
    ) -> list[Generated]:
        if self.takes_grammar is None:
            await asyncio.to_thread(self._probe)
        payload = {"model": served, "messages": self._messages(prompt), "logprobs": True, "top_logprobs": 0}
        payload.update(sampling)  # top_logprobs 0: llama-cpp-python returns no logprobs without it
        if self.takes_grammar:  # a llama.cpp server, whose own defaults would change the distribution sampled from
            payload.update(top_k=max(params.top_k, 0), min_p=0.0, repeat_penalty=1.0)
            if params.structured is not None and self.grammar_field is not None:
                payload.update(self.grammar_field.payload(answer_gbnf(params.structured)))
        if n > 1 and self.one_choice:
            bodies = await asyncio.gather(*(self._post(CHAT, _nth(payload, i)) for i in range(n)))
            choices = [self._choices(b, 1)[0] for b in bodies]
        else:
            body = await self._post(CHAT, payload)
            got = body.get("choices") if isinstance(body, dict) else None
            if n > 1 and isinstance(got, list) and len(got) == 1:  # the server ignores `n`: ask n - 1 more times
                self.one_choice = True
                rest = await asyncio.gather(*(self._post(CHAT, _nth(payload, i)) for i in range(1, n)))
                choices = [got[0], *(self._choices(b, 1)[0] for b in rest)]
            else:
                choices = self._choices(body, n)
        return [self._chat_choice(c, version, params.stop) for c in choices]

    @staticmethod
    def _chat_choice(choice: dict[str, Any], version: int, stop: tuple[str, ...] = ()) -> Generated:
        content = (choice.get("logprobs") or {}).get("content") or None
        logprobs = [float(t["logprob"]) for t in content] if content else None
        text = str((choice.get("message") or {}).get("content") or "")
        if content and stop and choice.get("finish_reason") == "stop":
            # The server cut the stop string from the text; its tokens, listed with their logprobs, still hold it
            sampled = "".join(str(t.get("token", "")) for t in content)
            if sampled.startswith(text) and any(s and sampled.startswith(s, len(text)) for s in stop):
                text = sampled
        return Generated(text, None, logprobs, choice.get("finish_reason"), version)

    def generate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]:
        return asyncio.run(self.agenerate(prompt, params, n))

    # ---- publishing -------------------------------------------------------------------------------------
    def publish(self, adapter_dir: str | os.PathLike[str], version: int) -> None:
        """Load the adapter as `policy-v{version}`, route new requests to it, unload the one before last.

        A name the server still holds (a rollback serves an older version again, or a failed step's number is
        reused) is unloaded first: vLLM refuses to load a name twice, and the directory may hold new weights."""
        name = f"policy-v{version}"
        if name in self._adapters:
            self._unload([name])
        asyncio.run(self._post_once("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(adapter_dir)}))
        with self._lock:
            self.served, self.version = name, version
            self._adapters.append(name)
            stale = self._adapters[:-2]
            self._adapters = self._adapters[-2:]
        self._unload(stale)

    def serve_base(self, version: int) -> None:
        """Name the base model in every request from now on, as `version`, and unload the adapters."""
        with self._lock:
            self.served, self.version = self._model, version
            loaded = list(self._adapters)
        self._unload(loaded)

    def _unload(self, names: list[str]) -> None:
        """Best effort: a failed unload costs only server memory. A name whose unload failed stays listed (the
        server may still hold it), so that loading that name again unloads it first."""
        for name in names:
            try:
                asyncio.run(self._post_once("/v1/unload_lora_adapter", {"lora_name": name}))
            except PolicyError:
                continue
            with self._lock:
                if name in self._adapters:
                    self._adapters.remove(name)

    async def _post_once(self, path: str, payload: dict[str, Any]) -> Any:
        url = f"{self.base_url}{path}"
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, headers=self._headers()) as client:
                response = await client.post(url, json=payload)
        except httpx.TransportError as exc:
            raise PolicyError(f"{url}: {exc}") from None
        if response.status_code >= 400:
            raise PolicyError(
                f"{url}: HTTP {response.status_code}: {response.text[:300]} (the server needs "
                "--enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)"
            )
        return response.text

    def close(self) -> None:
        pass


def _nth(payload: dict[str, Any], i: int) -> dict[str, Any]:
    """The i-th of n one-choice requests that stand for one request of n choices, each with its own seed."""
    seed = payload.get("seed")
    if seed is not None and i > 0:
        seed = (seed + i * 0x9E3779B1) % 2**31
    return {**payload, "n": 1, "seed": seed}


def _blocking(make: Any) -> Any:
    """`asyncio.run(make())`, also from a thread whose event loop is running (the engine asks for
    `structured_formats` there): then in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def parse_spec(flavor: str, arg: str) -> HttpPolicy:
    """`URL` or `URL@MODEL` (the model is required for openai:), parsed by `PolicySpec`."""
    from policies.spec import PolicySpec

    spec = PolicySpec.parse(f"{flavor}:{arg}")
    return HttpPolicy(spec.urls[0], spec.model, flavor=flavor)
