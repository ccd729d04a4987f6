"""llama-cpp-python's own OpenAI-compatible server (`python -m llama_cpp.server`), started as a subprocess over a
GGUF file, for the tests of the `openai:` policy against a real server.

Where its extras (`pip install 'vpo-evolve[server]'`, scripts/setup.sh) are missing it is a skip on a developer's
machine and a failure under EVOLVE_REQUIRE_SERVICES=1 (CI); where they are installed and the server still does
not answer, it is a failure everywhere, with the tail of the server's output.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

START_S = 60.0  # the tiny model loads in about a second; a loaded 2-core machine may take many more


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    def __init__(self, model: Path, log: Path, alias: str = "tiny", n_ctx: int = 4096) -> None:
        self.model, self.log, self.alias, self.n_ctx = model, log, alias, n_ctx
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def spec(self) -> str:
        return f"openai:{self.url}@{self.alias}"

    def start(self) -> LlamaServer:
        from tests.services import missing

        try:
            import llama_cpp.server.app  # noqa: F401  (fastapi, uvicorn, sse-starlette, ...)
        except ImportError as exc:
            missing("llama-cpp-python's server", f"{exc}; pip install 'vpo-evolve[server]' (scripts/setup.sh does)")
        command = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(self.model), "--model_alias", self.alias,
            "--host", "127.0.0.1", "--port", str(self.port), "--n_ctx", str(self.n_ctx),
            "--n_threads", "1", "--n_threads_batch", "1", "--verbose", "False",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # its access log, counted by `requests`, as it is written
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._fail(f"exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        self._fail(f"did not answer GET /v1/models within {START_S:.0f} s")
        raise AssertionError  # unreachable: _fail raises

    def _fail(self, why: str) -> None:
        self.stop()
        tail = self.log.read_text(errors="replace")[-3000:]
        pytest.fail(f"llama-cpp-python's server on {self.model} {why}; its output ends:\n{tail}", pytrace=False)

    def requests(self, at_least: int = 0, path: str = "/v1/chat/completions") -> int:
        """How many requests to `path` the server has logged (uvicorn's access log, written just after each
        answer: waited for, up to 5 s, until it counts `at_least`)."""
        deadline = time.monotonic() + 5
        while True:
            count = self.log.read_text(errors="replace").count(f'"POST {path} HTTP')
            if count >= at_least or time.monotonic() > deadline:
                return count
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
