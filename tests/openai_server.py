"""A real OpenAI-compatible HTTP server on 127.0.0.1 over a tiny transformers model, for the HTTP policy tests.

It implements what vpo-evolve uses of vLLM: `/v1/models`, `/tokenize` (chat template), `/v1/completions`
(n, token-id prompts, top-k/top-p, sampled token ids and their logprobs), `/v1/chat/completions`, and runtime
LoRA `/v1/load_lora_adapter` / `/v1/unload_lora_adapter`. Faults are injected on demand (5xx, malformed JSON).

Like vLLM, it returns raw logprobs (the model's distribution at temperature 1, before any warping) unless started
with `logprobs_mode="processed_logprobs"` (vLLM: `--logprobs-mode processed_logprobs`), when it returns those
of the distribution each token was actually drawn from.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from policies.policy import SamplingParams
from policies.transformers_policy import TransformersPolicy


class LoopbackServer:
    def __init__(self, model_dir: Path, port: int = 0, logprobs_mode: str = "raw_logprobs") -> None:
        if logprobs_mode not in ("raw_logprobs", "processed_logprobs"):
            raise ValueError(f"logprobs_mode {logprobs_mode!r}: use raw_logprobs or processed_logprobs")
        self.logprobs_mode = logprobs_mode
        self.policy = TransformersPolicy.load(str(model_dir))
        self.model_name = str(model_dir)
        self.adapters: dict[str, str] = {}
        self.faults: list[str] = []  # "500", "garbage", or "load-500" (for the next adapter load)
        self.requests: list[tuple[str, str]] = []  # (path, model) of every request
        self._lock = threading.Lock()
        self._port = port
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> LoopbackServer:
        handler = type("Handler", (_Handler,), {"app": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), handler)
        self._server.daemon_threads = True
        self._port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---- model ------------------------------------------------------------------------------------------
    def _select(self, model: str) -> Any:
        """Returns a context manager that activates the requested base model or adapter, or None if unknown."""
        from contextlib import nullcontext

        inner = self.policy.model
        if model == self.model_name:
            return inner.disable_adapter() if hasattr(inner, "disable_adapter") and self.adapters else nullcontext()
        if model in self.adapters:
            inner.set_adapter(model)
            return nullcontext()
        return None

    def sample(self, model: str, prompt_ids: list[int], body: dict[str, Any]) -> list[Any] | None:
        params = SamplingParams(
            float(body.get("temperature", 1.0)),
            float(body.get("top_p", 1.0)),
            int(body.get("max_tokens", 16)),
            body.get("seed"),
            max(0, int(body.get("top_k", 0))),  # vLLM: -1 or 0 means no top-k cut
            tuple(body.get("stop") or ()),
        )
        with self._lock:
            ctx = self._select(model)
            if ctx is None:
                return None
            with ctx:
                out = self.policy.generate_ids(prompt_ids, params, int(body.get("n", 1)))
                if params.stop and not body.get("include_stop_str_in_output"):  # OpenAI's and vLLM's default
                    out = [replace(g, text=_before_stop(g.text, params.stop)) for g in out]
                if self.logprobs_mode == "raw_logprobs":
                    out = [replace(g, logprobs=self._raw_logprobs(prompt_ids, g.token_ids)) for g in out]
                return out

    def _raw_logprobs(self, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
        """The model's own logprobs of the sampled tokens, before temperature, top-k and top-p."""
        import torch

        ids = torch.tensor([prompt_ids + completion_ids], device=self.policy.device)
        with torch.no_grad():
            logits = self.policy.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
        picked = torch.log_softmax(logits, dim=-1).gather(1, ids[0, len(prompt_ids) :, None]).squeeze(1)
        return picked.tolist()

    def load_adapter(self, name: str, path: str) -> str | None:
        from peft import PeftModel

        if not (Path(path) / "adapter_model.safetensors").is_file():
            return f"no adapter at {path}"
        with self._lock:
            if name in self.adapters:  # as vLLM answers: a name is loaded once, until it is unloaded
                return f"The lora adapter '{name}' has already been loaded."
            if isinstance(self.policy.model, PeftModel):
                self.policy.model.load_adapter(path, adapter_name=name)
            else:
                self.policy.model = PeftModel.from_pretrained(self.policy.model, path, adapter_name=name)
            self.policy.model.eval()
            self.adapters[name] = path
        return None

    def unload_adapter(self, name: str) -> bool:
        with self._lock:
            if name not in self.adapters:
                return False
            del self.adapters[name]
            if self.adapters:
                self.policy.model.delete_adapter(name)
            else:  # peft keeps no model without an adapter: the base model comes back as it was
                self.policy.model = self.policy.model.unload()
            return True


def _before_stop(text: str, stop: tuple[str, ...]) -> str:
    cuts = [text.find(s) for s in stop if s in text]
    return text[: min(cuts)] if cuts else text


class _Handler(BaseHTTPRequestHandler):
    app: LoopbackServer

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, payload: Any, raw: bytes | None = None) -> None:
        data = raw if raw is not None else json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            ids = [self.app.model_name, *self.app.adapters]
            self._send(200, {"object": "list", "data": [{"id": i, "object": "model"} for i in ids]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        app = self.app
        app.requests.append((self.path, str(body.get("model"))))
        if self.path == "/v1/load_lora_adapter":
            if app.faults and app.faults[0] == "load-500":
                app.faults.pop(0)
                return self._send(500, {"error": "injected load failure"})
            problem = app.load_adapter(body["lora_name"], body["lora_path"])
            return self._send(400 if problem else 200, {"error": problem} if problem else {"status": "ok"})
        if self.path == "/v1/unload_lora_adapter":
            return self._send(200 if app.unload_adapter(body["lora_name"]) else 404, {})
        if app.faults and app.faults[0] in ("500", "garbage"):
            fault = app.faults.pop(0)
            return self._send(500, {"error": "injected"}) if fault == "500" else self._send(200, None, b"{not json")
        if self.path == "/tokenize":
            user = [m["content"] for m in body.get("messages", []) if m["role"] == "user"]
            text = app.policy.render(user[-1]) if user else body.get("prompt", "")
            return self._send(200, {"tokens": app.policy.tokenizer(text, add_special_tokens=False).input_ids})
        if self.path in ("/v1/completions", "/v1/chat/completions"):
            chat = self.path.endswith("chat/completions")
            if chat:
                user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
                prompt_ids = app.policy.tokenizer(app.policy.render(user), add_special_tokens=False).input_ids
            else:
                prompt = body["prompt"]
                prompt_ids = prompt if isinstance(prompt, list) else app.policy.tokenizer(prompt).input_ids
            out = app.sample(str(body.get("model")), prompt_ids, body)
            if out is None:
                return self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
            return self._send(200, {"choices": [_chat(i, g) if chat else _completion(i, g) for i, g in enumerate(out)]})
        self._send(404, {"error": "not found"})


def _completion(index: int, g: Any) -> dict[str, Any]:
    return {
        "index": index,
        "text": g.text,
        "finish_reason": g.finish_reason,
        "logprobs": {"tokens": [f"token_id:{t}" for t in g.token_ids], "token_logprobs": g.logprobs},
    }


def _chat(index: int, g: Any) -> dict[str, Any]:
    return {
        "index": index,
        "finish_reason": g.finish_reason,
        "message": {"role": "assistant", "content": g.text},
        "logprobs": {"content": [{"token": "?", "logprob": lp} for lp in g.logprobs]},
    }
