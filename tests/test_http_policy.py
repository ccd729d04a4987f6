"""The vLLM / OpenAI HTTP policies against a real loopback server over the tiny model."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import threading
import time

import pytest
import torch

from evolve.loop import SearchLoop, run_search
from evolve.training import ArchiveTrainer
from policies.http_policy import HttpPolicy, parse_spec
from policies.policy import PolicyError, SamplingParams
from policies.trainer import TrainConfig
from sandboxes.process import ProcessSandbox
from tests.helpers import evolve_run_cmd, square_run, write_square_problem
from tests.openai_server import LoopbackServer

pytestmark = pytest.mark.slow
PARAMS = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=160, seed=3)


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    s = LoopbackServer(tiny_model_dir).start()
    yield s
    s.stop()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_group_comes_back_with_token_ids_and_processed_logprobs(server):
    policy = HttpPolicy(server.url, server.model_name, max_wait_s=30)
    group = policy.generate("Square the input.", PARAMS, 4)
    assert len(group) == 4 and all(g.version == 0 for g in group)
    for g in group:
        assert g.token_ids and len(g.token_ids) == len(g.logprobs) and all(lp <= 0 for lp in g.logprobs)
        assert server.policy.tokenizer.decode(g.token_ids, skip_special_tokens=True) == g.text


def test_model_name_from_the_server_and_a_wrong_one(server):
    found = parse_spec("vllm", server.url)
    found.generate("x", PARAMS, 1)
    assert found.name.endswith(server.model_name)
    wrong = HttpPolicy(server.url, "no-such-model", max_wait_s=30)
    start = time.monotonic()
    with pytest.raises(PolicyError, match=r"HTTP 404.*check the model name"):
        wrong.generate("x", PARAMS, 2)
    assert time.monotonic() - start < 5  # a 4xx is not retried
    with pytest.raises(PolicyError, match="name the model"):
        parse_spec("openai", server.url)


def test_5xx_and_malformed_json_are_retried(server):
    policy = HttpPolicy(server.url, server.model_name, max_wait_s=60)
    server.faults[:] = ["500", "garbage", "500"]
    group = policy.generate("Square the input.", PARAMS, 2)
    assert len(group) == 2 and server.faults == []


def test_stop_string_reaches_the_server_and_stays_in_vllm_text(server):
    """vLLM is asked to keep the stop string (the token ids then match the text); an OpenAI server drops it."""
    from dataclasses import replace

    from tests.conftest import tiny_pairs

    prompt, stop = tiny_pairs()[0][0], replace(PARAMS, stop=("</variant 1>",))
    vllm_group = HttpPolicy(server.url, server.model_name, max_wait_s=30).generate(prompt, stop, 3)
    stopped = [g for g in vllm_group if g.finish_reason == "stop" and g.text.endswith("</variant 1>")]
    assert stopped  # the taught model writes the tag: at least one row ends right after it
    for g in vllm_group:
        assert g.text.count("</variant 1>") <= 1 and len(g.token_ids) == len(g.logprobs)
        assert server.policy.tokenizer.decode(g.token_ids, skip_special_tokens=True) == g.text
    chat_policy = HttpPolicy(server.url, server.model_name, flavor="openai", max_wait_s=30)
    chat = chat_policy.generate(prompt, stop, 3)
    assert all("</variant 1>" not in g.text for g in chat)


def test_server_down_gives_up_with_a_clear_error_after_max_wait():
    policy = HttpPolicy(f"http://127.0.0.1:{_free_port()}", "m", max_wait_s=1.5)
    with pytest.raises(PolicyError, match="is the server up"):
        policy.generate("x", PARAMS, 1)


def test_openai_flavor_keeps_logprobs_without_token_ids(server):
    policy = HttpPolicy(server.url, server.model_name, flavor="openai", max_wait_s=30)
    group = policy.generate("Square the input.", PARAMS, 3)
    assert all(g.token_ids is None and g.logprobs for g in group)


@pytest.mark.parametrize("suffix", ["/v1", "/v1/"])
def test_a_base_url_given_with_its_v1_as_hosted_apis_write_it_reaches_the_same_server(server, suffix):
    for flavor in ("openai", "vllm"):
        policy = HttpPolicy(server.url + suffix, server.model_name, flavor=flavor, max_wait_s=5)
        assert policy.base_url == server.url and len(policy.generate("Square the input.", PARAMS, 2)) == 2


def test_whole_run_against_the_server_with_it_down_at_start(tmp_path, tiny_model_dir):
    folder = write_square_problem(tmp_path / "sq")
    port = _free_port()
    late = LoopbackServer(tiny_model_dir, port=port)
    threading.Timer(3.0, late.start).start()  # nothing listens when the run starts
    db = tmp_path / "run.db"
    try:
        policy = f"vllm:http://127.0.0.1:{port}@{tiny_model_dir}"
        out = subprocess.run(evolve_run_cmd(folder, db, policy, 8), capture_output=True, text=True, timeout=300)
    finally:
        late.stop()
    assert out.returncode == 0, out.stderr[-2000:]
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == 8
    ids, lps = con.execute("SELECT token_ids, logprobs FROM completions LIMIT 1").fetchone()
    assert len(ids) == len(lps) > 0


def test_server_down_mid_run_loses_nothing(tmp_path, tiny_model_dir):
    port = _free_port()
    srv = LoopbackServer(tiny_model_dir, port=port).start()
    problem, archive, run, options = square_run(tmp_path, max_evaluations=10)
    policy = HttpPolicy(srv.url, srv.model_name, max_wait_s=120)
    loop = SearchLoop(problem, archive, policy, ProcessSandbox(slots=2), run, options)

    def outage() -> None:
        while loop.stats.groups < 1:
            time.sleep(0.05)
        srv.stop()
        time.sleep(2.5)
        srv.start()

    threading.Thread(target=outage, daemon=True).start()
    try:
        assert run_search(loop) == "evaluation budget reached"
    finally:
        srv.stop()
    con = sqlite3.connect(tmp_path / "a.db")
    assert con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == 10
    assert con.execute("SELECT COUNT(*) FROM completions").fetchone()[0] == 4 * loop.stats.groups


def test_publish_routes_requests_to_the_new_adapter_and_a_failed_one_keeps_the_old(tmp_path, server, tiny_model_dir):
    from peft import get_peft_model_state_dict

    problem, archive, run, options = square_run(tmp_path, max_evaluations=6)
    policy = HttpPolicy(server.url, server.model_name, max_wait_s=60)
    assert run_search(SearchLoop(problem, archive, policy, ProcessSandbox(slots=2), run, options)).startswith(
        "evaluation budget"
    )
    before = policy.generate("Square the input.", PARAMS, 2)
    trainer = ArchiveTrainer(
        archive,
        run.id,
        list(problem.components),
        2,
        policy,
        TrainConfig(learning_rate=1e-3, lora_rank=4),
        tmp_path / "adapters",
        trainer_model=str(tiny_model_dir),
    )
    weights = {k: v.clone() for k, v in get_peft_model_state_dict(trainer.trainer.model).items()}
    server.faults[:] = ["load-500"]
    with pytest.raises(PolicyError, match="HTTP 500"):
        trainer.step()  # trained and saved, but the server refused the adapter
    assert policy.version == 0 and policy.served == server.model_name
    assert not (tmp_path / "adapters" / "v1").exists()  # no trace but the failure
    assert sqlite3.connect(tmp_path / "a.db").execute("SELECT COUNT(*) FROM policy_versions").fetchone()[0] == 1
    assert trainer.trainer.optimizer.state_dict()["state"] == {}  # the optimizer step was undone too
    restored = get_peft_model_state_dict(trainer.trainer.model)
    assert all(torch.equal(weights[k], restored[k]) for k in weights)

    stats = trainer.step()
    assert stats.samples > 0 and policy.version == 1 and policy.served == "policy-v1"
    after = policy.generate("Square the input.", PARAMS, 2)
    assert all(g.version == 1 for g in after)
    assert [g.logprobs for g in after] != [g.logprobs for g in before]  # same seed, another distribution
    server.requests.clear()
    con = sqlite3.connect(tmp_path / "a.db")
    done = con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
    waiting = con.execute("SELECT COUNT(*) FROM variants WHERE status = 'ok' AND program_id IS NULL").fetchone()[0]
    budget = square_run_options(options, done + waiting + 2)  # the pending children, then two new ones
    resumed = SearchLoop(problem, archive, policy, ProcessSandbox(slots=2), run, budget)
    run_search(resumed)
    assert {m for path, m in server.requests if path == "/v1/completions"} == {"policy-v1"}
    numbers = [
        n
        for (n,) in con.execute(
            "SELECT v.number FROM completions c JOIN policy_versions v ON c.policy_version_id = v.id ORDER BY c.id"
        )
    ]
    assert numbers[0] == 0 and numbers[-1] == 1 and numbers == sorted(numbers)
    with pytest.raises(PolicyError, match="HTTP 400"):
        policy.publish(tmp_path / "missing-adapter", 99)
    assert policy.version == 1


def square_run_options(options, max_evaluations: int):
    from dataclasses import replace

    return replace(options, max_evaluations=max_evaluations)
