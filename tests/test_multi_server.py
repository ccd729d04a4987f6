"""`--policy vllm:URL1,URL2`: groups spread over several real loopback servers, failover when one goes away,
its return noticed, and adapters published to every server (each serving only what it has loaded)."""

from __future__ import annotations

import socket
import time

import pytest

from policies.from_spec import make_policy
from policies.multi_server import MultiServerPolicy, parse_servers
from policies.policy import PolicyError, SamplingParams
from tests.openai_server import LoopbackServer

pytestmark = pytest.mark.slow
PARAMS = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=24, seed=3)
SHORT_WAITS = {"per_server_wait_s": 1.0, "backoff_s": (0.5, 60.0)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _generations(server: LoopbackServer) -> int:
    return sum(1 for path, _ in server.requests if "completions" in path)


def test_groups_spread_fail_over_and_come_back(tiny_model_dir):
    a = LoopbackServer(tiny_model_dir).start()
    port_b = _free_port()
    b = LoopbackServer(tiny_model_dir, port=port_b).start()
    try:
        spec = f"{a.url},{b.url}@{a.model_name}"
        made = make_policy(f"vllm:{spec}")
        assert isinstance(made, MultiServerPolicy) and made.max_concurrency == 8
        assert made.servers_up() == [a.url, b.url]
        # the same servers, with shorter waits than the production defaults (5 s on a failing server, then a
        # pause of 2 s doubling): the test stops b on purpose and waits for its return
        policy = parse_servers("vllm", spec, **SHORT_WAITS)
        import asyncio

        async def groups(count: int) -> list:
            return await asyncio.gather(*(policy.agenerate("Square the input.", PARAMS, 2) for _ in range(count)))

        assert all(len(g) == 2 for g in asyncio.run(groups(4)))
        assert _generations(a) >= 1 and _generations(b) >= 1  # both servers sampled
        b.stop()
        before_a = _generations(a)
        start = time.monotonic()
        assert all(len(g) == 2 for g in asyncio.run(groups(4)))  # every group answered, by a alone
        assert _generations(a) - before_a == 4
        assert time.monotonic() - start < 60
        assert policy.health()[b.url]["failures"] >= 1 and policy.health()[a.url]["failures"] == 0
        b = LoopbackServer(tiny_model_dir, port=port_b).start()  # b comes back on its address
        time.sleep(float(policy.health()[b.url]["retry_in_s"]) + 0.5)  # past b's current back-off
        asyncio.run(groups(4))
        assert _generations(b) >= 1 and policy.health()[b.url]["failures"] == 0
    finally:
        a.stop()
        b.stop()


def test_publish_loads_on_every_server_and_a_missed_one_catches_up(tmp_path, tiny_model_dir):
    from peft import LoraConfig, get_peft_model

    from policies.transformers_policy import TransformersPolicy

    base = TransformersPolicy.load(str(tiny_model_dir))
    peft_model = get_peft_model(base.model, LoraConfig(r=2, target_modules="all-linear"))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    a, b = LoopbackServer(tiny_model_dir).start(), LoopbackServer(tiny_model_dir).start()
    try:
        servers = [make_policy(f"vllm:{s.url}@{s.model_name}") for s in (a, b)]
        policy = MultiServerPolicy(servers, **SHORT_WAITS)  # type: ignore[arg-type]
        b.faults.append("load-500")  # b refuses the first load
        policy.publish(adapter, 1)
        assert policy.version == 1 and "policy-v1" in a.adapters and "policy-v1" not in b.adapters
        # b's back-off passes; before b is used again it loads the adapter
        time.sleep(float(policy.health()[b.url]["retry_in_s"]) + 0.5)
        for _ in range(6):
            group = policy.generate("Square the input.", PARAMS, 1)
            assert group[0].version == 1
        assert "policy-v1" in b.adapters and policy.health()[b.url]["version"] == 1
        models = {model for _, model in a.requests + b.requests if model}
        assert "policy-v1" in models
        a.faults.append("load-500")
        b.faults.append("load-500")
        with pytest.raises(PolicyError):
            policy.publish(adapter, 2)  # nobody could load it: the old version keeps serving
        assert policy.version == 1
    finally:
        a.stop()
        b.stop()
