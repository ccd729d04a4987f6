"""A vLLM stand-in on 127.0.0.1: the tiny GGUF model sampled by the project's own llama policy, behind the
endpoints the `vllm:` policy uses, reading a request's grammar as a vLLM of a given age does.

Why a stand-in: vLLM needs a GPU and is not installed here. What the `vllm:` policy relies on is the request's
fields and what comes back, and those are served here with real sampling under a real grammar engine
(llama.cpp's, through `LlamaPolicy.generate_ids(gbnf=...)`), so a test sees every row held to the grammar that
was sent, or free text where the server does not read the field.

Endpoints: `GET /v1/models`, `POST /tokenize` (chat messages, laid out by the model's chat template),
`POST /v1/completions` (a token-id or text prompt; n, seed, temperature, top_p, top_k (-1: off), max_tokens,
stop and include_stop_str_in_output; the sampled tokens as `token_id:N` with their logprobs, as vLLM answers
`logprobs=0` with `return_tokens_as_token_ids`).

`grammar_field` says which request field holds a grammar, as vLLM's releases read them:
- "structured_outputs": `{"structured_outputs": {"grammar": ...}}` only (vLLM 0.12.0 on; from 0.10.2 both);
- "guided_grammar": `{"guided_grammar": ...}` only (vLLM before 0.10.2);
- "none": neither: free text (the field is ignored, as vLLM ignores fields it does not know: its request models
  allow extra fields and only log them);
- "refuses": either field is refused with HTTP 400, as vLLM refuses a grammar its backend does not take (the
  outlines backend takes none).
A grammar llama.cpp cannot parse is refused with HTTP 400, as vLLM refuses an invalid one. The logprobs are the
llama policy's: those of the distribution each token was drawn from, the grammar's mask included.
"""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from policies.from_spec import make_policy
from policies.policy import Generated, PolicyError, SamplingParams, chat_token_ids

GRAMMAR_FIELDS = ("structured_outputs", "guided_grammar", "none", "refuses")


class VllmStandIn:
    def __init__(self, gguf: Path, grammar_field: str = "structured_outputs") -> None:
        self.policy: Any = make_policy(f"llama:{gguf}")
        self.model_name = gguf.name
        self.grammar_field = grammar_field
        self.bodies: list[tuple[str, dict[str, Any]]] = []  # (path, body) of every POST, in order
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> VllmStandIn:
        handler = type("Handler", (_Handler,), {"app": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.policy.close()

    def completions(self, path: str) -> list[dict[str, Any]]:
        """The bodies of the requests to `path` the server was sent, in order."""
        return [body for p, body in self.bodies if p == path]

    # ---- what a request asks for --------------------------------------------------------------------------
    def grammar(self, body: dict[str, Any]) -> str | None:
        """The grammar the request holds in the field this server reads; ValueError where it refuses one."""
        asked = body.get("structured_outputs") or {}
        fields = {"structured_outputs": asked.get("grammar"), "guided_grammar": body.get("guided_grammar")}
        if self.grammar_field == "refuses" and any(fields.values()):
            raise ValueError("this server's structured outputs backend does not support grammar specifications")
        return fields.get(self.grammar_field)

    def sample(self, body: dict[str, Any]) -> list[Generated]:
        prompt = body.get("prompt")
        tokenizer = self.policy.tokenizer
        ids = prompt if isinstance(prompt, list) else tokenizer(str(prompt), add_special_tokens=False).input_ids
        stop = body.get("stop") or ()
        params = SamplingParams(
            float(body.get("temperature", 1.0)),
            float(body.get("top_p", 1.0)),
            int(body.get("max_tokens", 16)),
            body.get("seed"),
            max(0, int(body.get("top_k") or 0)),
            tuple([stop] if isinstance(stop, str) else stop),
        )
        gbnf = self.grammar(body)
        with self._lock:  # one llama.cpp context: one call at a time
            out = self.policy.generate_ids(ids, params, int(body.get("n", 1)), gbnf=gbnf)
        if params.stop and not body.get("include_stop_str_in_output"):
            out = [replace(g, text=_before_stop(g.text, params.stop)) for g in out]
        return out


def _before_stop(text: str, stop: tuple[str, ...]) -> str:
    cuts = [text.find(s) for s in stop if s in text]
    return text[: min(cuts)] if cuts else text


class _Handler(BaseHTTPRequestHandler):
    app: VllmStandIn

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, code: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{"id": self.app.model_name, "object": "model"}]})
        self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        app = self.app
        app.bodies.append((self.path, body))
        if body.get("model") != app.model_name:
            return self._send(404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}})
        if self.path == "/tokenize":
            user = [m["content"] for m in body.get("messages", []) if m["role"] == "user"]
            return self._send(200, {"tokens": chat_token_ids(app.policy.tokenizer, user[-1] if user else "")})
        if self.path != "/v1/completions":
            return self._send(404, {"error": "not found"})
        try:
            out = app.sample(body)
        except (ValueError, PolicyError) as exc:  # a refused or unparsable grammar
            return self._send(400, {"error": {"message": str(exc), "type": "BadRequestError"}})
        self._send(200, {"choices": [_choice(i, g) for i, g in enumerate(out)]})


def _choice(index: int, g: Generated) -> dict[str, Any]:
    return {
        "index": index,
        "text": g.text,
        "finish_reason": g.finish_reason,
        "logprobs": {"tokens": [f"token_id:{t}" for t in g.token_ids or []], "token_logprobs": g.logprobs},
    }
