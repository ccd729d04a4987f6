"""Several OpenAI-compatible servers (one vLLM per GPU node) behind one Policy.

Each group goes to the healthy server with the fewest groups in flight. A server that fails a request is
marked down and retried after a back-off (doubling to a cap); the group it held is sent to another server at
once, so a lost GPU node costs a re-sent group, never a stopped run. `publish()` loads a new adapter on every
server; each server serves the newest adapter it has loaded (its completions carry that version), and a
server that missed a publish gets it again before it is next used. `serve_base()` (a rollback) returns every
server to the base model.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from dataclasses import dataclass

from policies.http_policy import HttpPolicy
from policies.policy import Generated, PolicyError, SamplingParams

PER_SERVER_WAIT_S = 5.0  # how long one server may keep failing before its group goes elsewhere
BACKOFF_S = (2.0, 60.0)  # first and largest pause before a failed server is tried again


@dataclass
class _Server:
    policy: HttpPolicy
    in_flight: int = 0
    down_until: float = 0.0
    failures: int = 0
    last_error: str = ""
    served: int = 0


class MultiServerPolicy:
    def __init__(
        self,
        servers: list[HttpPolicy],
        *,
        max_wait_s: float = 900.0,
        per_server_wait_s: float = PER_SERVER_WAIT_S,
        backoff_s: tuple[float, float] = BACKOFF_S,
    ) -> None:
        """`per_server_wait_s`: how long a group keeps retrying a failing server before it goes elsewhere;
        `backoff_s`: the first and largest pause before a failed server is tried again. The tests shorten both:
        they stop servers on purpose and need not wait the production defaults out."""
        if not servers:
            raise PolicyError("no server given; use vllm:URL1,URL2,...")
        for s in servers:
            s.max_wait_s = min(s.max_wait_s, per_server_wait_s)
        self._backoff_s = backoff_s
        self._servers = [_Server(s) for s in servers]
        self.max_wait_s = max_wait_s
        self.max_concurrency = sum(s.max_concurrency for s in servers)
        self.version = 0
        self.name = f"{servers[0].flavor}:[{', '.join(s.base_url for s in servers)}]"
        self._published: tuple[str, int] | None = None
        self._lock = threading.Lock()

    @property
    def status(self) -> str:
        down = [s for s in self._servers if s.down_until > time.monotonic()]
        if not down:
            return ""
        return "; ".join(f"{s.policy.base_url} down ({s.last_error})" for s in down)

    def servers_up(self) -> list[str]:
        now = time.monotonic()
        return [s.policy.base_url for s in self._servers if s.down_until <= now]

    def health(self) -> dict[str, dict[str, object]]:
        """Per server: failures in a row, the last error, the adapter version it serves, and the seconds until a
        server that failed is tried again (0 for one in use)."""
        now = time.monotonic()
        return {
            s.policy.base_url: {
                "failures": s.failures,
                "last_error": s.last_error,
                "version": s.policy.version,
                "retry_in_s": max(0.0, s.down_until - now),
            }
            for s in self._servers
        }

    # ---- routing ----------------------------------------------------------------------------------------
    def _choose(self) -> _Server | None:
        now = time.monotonic()
        with self._lock:
            healthy = [s for s in self._servers if s.down_until <= now]
            if not healthy:
                return None
            chosen = min(healthy, key=lambda s: (s.in_flight, s.served))
            chosen.in_flight += 1
            chosen.served += 1
            return chosen

    def _failed(self, server: _Server, exc: Exception) -> None:
        with self._lock:
            server.failures += 1
            first, largest = self._backoff_s
            pause = min(largest, first * 2 ** (server.failures - 1))
            server.down_until = time.monotonic() + pause
            server.last_error = str(exc)[:200]

    async def _catch_up(self, server: _Server) -> None:
        """Load the newest adapter on a server that missed its publish (it was down, or refused it)."""
        published = self._published
        if published is not None and server.policy.version < published[1]:
            await asyncio.to_thread(server.policy.publish, *published)

    async def agenerate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]:
        start = time.monotonic()
        while True:
            server = self._choose()
            if server is None:
                if time.monotonic() - start > self.max_wait_s:
                    raise PolicyError(f"{self.name}: no server answered for {self.max_wait_s:.0f}s ({self.status})")
                await asyncio.sleep(0.5)
                continue
            try:
                await self._catch_up(server)
                group = await server.policy.agenerate(prompt, params, n)
            except PolicyError as exc:
                self._failed(server, exc)
                continue
            finally:
                with self._lock:
                    server.in_flight -= 1
            with self._lock:
                server.failures = 0
            return group

    def generate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]:
        return asyncio.run(self.agenerate(prompt, params, n))

    # ---- publishing -------------------------------------------------------------------------------------
    def publish(self, adapter_dir: str | os.PathLike[str], version: int) -> None:
        """Load the adapter on every server that answers; fails only when none could load it."""
        errors = []
        for server in self._servers:
            try:
                server.policy.publish(adapter_dir, version)
            except PolicyError as exc:
                errors.append(f"{server.policy.base_url}: {exc}")
                self._failed(server, exc)
        if len(errors) == len(self._servers):
            raise PolicyError("; ".join(errors))
        self._published = (str(adapter_dir), version)
        self.version = version

    def serve_base(self, version: int) -> None:
        """Every server names the base model in its requests again (the name is kept here, so a server that is
        down changes too; only its adapter unloads fail, harmlessly), and no server catches up an adapter."""
        with self._lock:
            self._published = None
        for server in self._servers:
            server.policy.serve_base(version)
        self.version = version

    def close(self) -> None:
        for server in self._servers:
            server.policy.close()


def parse_servers(
    flavor: str, arg: str, per_server_wait_s: float = PER_SERVER_WAIT_S, backoff_s: tuple[float, float] = BACKOFF_S
) -> MultiServerPolicy:
    """`URL1,URL2,...` with an optional `@MODEL` after the last URL (the same model on every server)."""
    from policies.http_policy import HttpPolicy
    from policies.spec import PolicySpec

    spec = PolicySpec.parse(f"{flavor}:{arg}")
    servers = [HttpPolicy(url, spec.model, flavor=flavor) for url in spec.urls]
    return MultiServerPolicy(servers, per_server_wait_s=per_server_wait_s, backoff_s=backoff_s)
