"""The llama.cpp policy on a tiny model written as GGUF on the spot: its stored logprobs are those of the torch
model on the same tokens (so the trainer's importance weight stays near 1), through the shared prompt cache
and its reuse across groups; stop strings, lengths, seeds, Ctrl-C and progress counting behave as the
transformers policy's do."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from policies.from_spec import make_policy
from policies.policy import Interruptible, PolicyError, SamplingParams
from policies.trainer import PolicyTrainer, Sample, TrainConfig
from policies.transformers_policy import TransformersPolicy
from tests.conftest import tiny_pairs
from tests.helpers import gguf_copy, need_llama
from tests.test_behaviour_logprobs import PROMPT, warped_logprobs

pytestmark = pytest.mark.slow
LOGPROB_BOUND = 2e-3  # float32 GGUF against float32 torch: different kernels, same arithmetic


@pytest.fixture(scope="module")
def llama(tiny_gguf):
    policy = make_policy(f"llama:{tiny_gguf}")
    yield policy
    policy.close()


@pytest.fixture(scope="module")
def torch_policy(tiny_model_dir):
    return TransformersPolicy.load(str(tiny_model_dir))


def _ids(policy, prompt: str) -> list[int]:
    return policy.tokenizer(policy.render(prompt), add_special_tokens=False).input_ids


def assert_logprobs_are_the_torch_models(group, torch_policy, prompt: str, params: SamplingParams) -> None:
    prompt_ids = _ids(torch_policy, prompt)
    for g in group:
        assert g.token_ids and len(g.logprobs) == len(g.token_ids)
        expected = warped_logprobs(torch_policy.model, prompt_ids, g.token_ids, params)
        torch.testing.assert_close(torch.tensor(g.logprobs, dtype=torch.float32), expected, atol=LOGPROB_BOUND, rtol=0)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=100, seed=5),
        SamplingParams(temperature=1.3, top_p=0.9, max_new_tokens=100, seed=6, top_k=12),
    ],
    ids=["defaults", "hot-with-top-k"],
)
def test_each_row_stores_the_torch_models_warped_logprob_of_its_tokens(llama, torch_policy, params):
    group = llama.generate(PROMPT, params, 4)
    assert len({tuple(g.token_ids) for g in group}) > 1  # the rows are sampled apart, not one row four times
    assert_logprobs_are_the_torch_models(group, torch_policy, PROMPT, params)


def test_the_prompt_cache_is_reused_across_groups_and_stays_exact(llama, torch_policy):
    params = SamplingParams(temperature=0.9, top_p=1.0, max_new_tokens=40, seed=1)
    longer = PROMPT + "\nKeep it short."
    for prompt in (PROMPT, longer, longer, PROMPT):  # extend the cached prompt, repeat it, cut it back
        group = llama.generate(prompt, params, 3)
        assert_logprobs_are_the_torch_models(group, torch_policy, prompt, params)
    assert llama.progress.prompt_tokens == 1  # the same prompt again: only its last token was decoded


def test_the_trainers_recomputation_agrees_so_the_importance_weight_is_near_one(llama, tiny_model_dir):
    params = SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=100, seed=9)
    local = TransformersPolicy.load(str(tiny_model_dir))
    trainer = PolicyTrainer(local.model, local.tokenizer, local.render, TrainConfig(lora_rank=4))
    prompt_ids = _ids(local, PROMPT)
    gaps, weights = [], []
    for g in llama.generate(PROMPT, params, 4):
        with torch.no_grad():
            recomputed = trainer.token_logprobs(Sample(prompt_ids, g.token_ids, g.logprobs, params.temperature, 1.0))
        stored = torch.tensor(g.logprobs, dtype=recomputed.dtype)
        gaps.append((recomputed - stored).abs())
        weights.append(torch.exp(recomputed - stored).clamp(max=2.0))
    assert float(torch.cat(gaps).max()) < LOGPROB_BOUND
    assert float(torch.cat(weights).mean()) == pytest.approx(1.0, abs=1e-3)


def test_rows_end_at_a_stop_string_or_the_length_and_a_seed_repeats_the_group(llama):
    taught = tiny_pairs()[0][0]  # a prompt the tiny model was taught to answer with tagged variants
    stop = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=200, seed=3, stop=("</variant 1>",))
    group = llama.generate(taught, stop, 4)
    for g in group:
        assert g.finish_reason in ("stop", "length")
        if g.finish_reason == "stop" and "</variant 1>" in g.text:
            # cut at the token that completed the stop string: without it, the text lacks the string
            assert "</variant 1>" not in llama.tokenizer.decode(g.token_ids[:-1], skip_special_tokens=True)
    assert any("</variant 1>" in g.text for g in group)
    assert [g.token_ids for g in llama.generate(taught, stop, 4)] == [g.token_ids for g in group]
    short = llama.generate(PROMPT, SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=5, seed=3), 2)
    assert [(len(g.token_ids), g.finish_reason) for g in short] == [(5, "length"), (5, "length")]
    assert llama.progress.tokens == 10 and llama.progress.rows_done == 2


@pytest.fixture(scope="module")
def endless(tmp_path_factory):
    """A model that cannot emit its EOS token, so that only an interrupt or the length ends a row."""
    need_llama()
    from policies.tiny import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, seed=1, vocab_size=len(tokenizer) - 2)
    source = tmp_path_factory.mktemp("endless") / "hf"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    policy = make_policy(f"llama:{gguf_copy(source, source.parent / 'gguf')}")
    yield policy
    policy.close()


def test_an_interrupt_ends_the_call_in_flight_and_a_withdrawn_one_ends_nothing(endless):
    assert isinstance(endless, Interruptible)
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=100_000, seed=0)
    timer = threading.Timer(1.0, endless.interrupt)
    start = time.monotonic()
    timer.start()
    group = endless.generate(PROMPT, params, 3)
    assert time.monotonic() - start < 10
    assert [g.finish_reason for g in group] == ["interrupted"] * 3
    # an honoured request is used up: the next call runs (it was once left set and ended every later call)
    short = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=5, seed=0)
    assert [g.finish_reason for g in endless.generate(PROMPT, short, 1)] == ["length"]
    endless.interrupt()  # found no call in flight: it ends the next one at once...
    assert [g.finish_reason for g in endless.generate(PROMPT, params, 2)] == ["interrupted"] * 2
    short = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=20, seed=0)
    assert [g.finish_reason for g in endless.generate(PROMPT, short, 2)] == ["length"] * 2  # ...and only that one
    endless.interrupt()
    endless.withdraw_interrupt()  # ...unless it is withdrawn
    done = endless.generate(PROMPT, SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=20, seed=0), 2)
    assert [(g.finish_reason, len(g.token_ids)) for g in done] == [("length", 20), ("length", 20)]


def test_a_missing_gguf_is_one_clear_error(tmp_path):
    need_llama()
    with pytest.raises(PolicyError, match="no such GGUF file"):
        make_policy(f"llama:{tmp_path / 'absent.gguf'}")


CLOSE_MID_DECODE = """
import sys, threading, time
from policies.policy import SamplingParams
from policies.from_spec import make_policy
from tests.test_behaviour_logprobs import PROMPT

policy = make_policy("llama:" + sys.argv[1])
ended = []

def sample():
    try:
        ended.append([g.finish_reason for g in policy.generate(PROMPT, SamplingParams(1.0, 1.0, 100_000, 0), 3)])
    except Exception as exc:
        ended.append(type(exc).__name__)

worker = threading.Thread(target=sample)
worker.start()
time.sleep(1.5)
policy.close()  # what a stopping run does while the loop no longer waits for the decode in flight
worker.join(30)
print("alive" if worker.is_alive() else ended)
"""


def test_closing_the_policy_while_a_group_decodes_ends_that_group_instead_of_crashing(endless_model_dir, tmp_path):
    """SIGTERM to the closed-loop study stopped its loop, which closed the llama.cpp policy while a decode still ran
    on a worker thread: the context was freed under it and the process died of a segmentation fault."""
    need_llama()
    import subprocess
    import sys
    from pathlib import Path

    gguf = gguf_copy(endless_model_dir, tmp_path / "gguf")
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", CLOSE_MID_DECODE, str(gguf)], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-400:]}"
    assert done.stdout.strip() in ("[['interrupted', 'interrupted', 'interrupted']]", "['PolicyError']")
