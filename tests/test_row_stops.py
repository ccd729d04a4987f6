"""A row of a batched group ends at its stop string or when it loops, alone, and keeps exactly what it sampled;
the engine asks for no more tokens than the editable code needs."""

from __future__ import annotations

import pytest
import torch

from evolve.prompts import completion_budget, completion_stop
from evolve.prompts.builder import HELD_MIN_CODE_TOKENS, HELD_ROOM
from policies.policy import SamplingParams
from policies.stops import REPEAT_WINDOW, repeats_itself
from policies.tiny import teach, tiny_model, tiny_tokenizer
from policies.transformers_policy import TransformersPolicy
from tests.test_behaviour_logprobs import warped_logprobs


def test_repeats_itself_finds_short_loops_only():
    assert repeats_itself([7] * REPEAT_WINDOW)
    assert repeats_itself([1, 2, 3] * (REPEAT_WINDOW // 3))
    assert repeats_itself(list(range(24)) * 4)
    assert not repeats_itself(list(range(25)) * 4)  # a 25-token pattern seen under 4 times is not a loop yet
    assert not repeats_itself([1, 2, 3] * 31 + [4, 5, 6])


@pytest.fixture(scope="module")
def random_policy():
    tok = tiny_tokenizer()
    return TransformersPolicy(tiny_model(tok, seed=3), tok, "tiny")


def test_a_stop_string_ends_its_row_alone_and_keeps_the_sampled_prefix(random_policy):
    """Byte-level tokens: 'e' is one token, and an untrained model samples it now and then. The same seed
    without the stop string samples the same tokens (finished rows still draw), so each stopped row must be
    exactly the unstopped row cut after its first 'e'; and its logprobs are still those of the warped
    distribution, so the trainer's importance weights stay exact."""
    policy = random_policy
    prompt_ids = policy.tokenizer("Write:", add_special_tokens=False).input_ids
    free = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=300, seed=4)
    stopped = SamplingParams(temperature=0.9, top_p=0.95, max_new_tokens=300, seed=4, stop=("e",))
    full = policy.generate_ids(prompt_ids, free, 4)
    cut = policy.generate_ids(prompt_ids, stopped, 4)
    lengths = []
    for whole, short in zip(full, cut, strict=True):
        assert len(short.token_ids) == len(short.logprobs)
        if "e" in whole.text:
            assert short.finish_reason == "stop"
            assert short.text.endswith("e") and "e" not in short.text[:-1]
            assert short.token_ids == whole.token_ids[: len(short.token_ids)]
        else:
            assert short.token_ids == whole.token_ids
        lengths.append(len(short.token_ids))
        expected = warped_logprobs(policy.model, prompt_ids, short.token_ids, stopped)
        assert torch.allclose(torch.tensor(short.logprobs), expected, atol=1e-4)
    assert len(set(lengths)) > 1  # the rows ended at different steps: each one stopped alone


def test_a_looping_row_ends_after_one_window():
    """A model taught to write 'ab' forever: its row ends as a repetition once the loop fills the window,
    instead of running to max_new_tokens."""
    tok = tiny_tokenizer()
    model = tiny_model(tok, seed=0, hidden=64)
    teach(model, tok, [("Loop:", "ab" * 150)], steps=60, lr=3e-3)
    policy = TransformersPolicy(model, tok, "tiny")
    prompt_ids = tok("Loop:", add_special_tokens=False).input_ids
    (g,) = policy.generate_ids(prompt_ids, SamplingParams(0.3, 1.0, 600, seed=1), 1)
    assert g.finish_reason == "repetition"
    assert len(g.token_ids) == REPEAT_WINDOW == len(g.logprobs)
    assert g.text == "ab" * (REPEAT_WINDOW // 2)


def test_completion_budget_follows_the_editable_code():
    short = "# EVOLVE-BLOCK-START\nx = 1\n# EVOLVE-BLOCK-END\n"
    long = "# EVOLVE-BLOCK-START\n" + "value = compute(value, 12345)\n" * 60 + "# EVOLVE-BLOCK-END\n"
    assert completion_budget(short, 3, "full", 768) == 160  # the floor: tags and a sentence still fit
    assert completion_budget(long, 3, "full", 768) == 768  # the problem's ceiling wins
    mid = "# EVOLVE-BLOCK-START\n" + "value = compute(value)\n" * 12 + "# EVOLVE-BLOCK-END\n"
    chars = len("value = compute(value)\n" * 12)
    assert completion_budget(mid, 3, "full", 4096) == int(3 * (1.5 * chars / 3 + 48))
    assert completion_budget(mid, 3, "diff", 4096) < completion_budget(mid, 3, "full", 4096)
    assert completion_stop(3) == ("</variant 3>",)


def test_a_held_answer_gets_more_room_and_a_floor_for_each_variant_s_code(tmp_path):
    """Under the grammar a row ends at its last answer, so the fitted budget only cuts rows that write longer code
    than the parent's: it gets HELD_ROOM times the room, at least HELD_MIN_CODE_TOKENS of code per variant, and
    the loop gives it to the groups whose answer the grammar holds."""
    mid = "# EVOLVE-BLOCK-START\n" + "value = compute(value)\n" * 12 + "# EVOLVE-BLOCK-END\n"
    chars = len("value = compute(value)\n" * 12)
    assert completion_budget(mid, 3, "full", 4096, held=True) == int(3 * (HELD_ROOM * 1.5 * chars / 3 + 48))
    short = "# EVOLVE-BLOCK-START\nx = 1\n# EVOLVE-BLOCK-END\n"
    assert completion_budget(short, 3, "full", 768, held=True) == 3 * (HELD_MIN_CODE_TOKENS + 48)
    assert completion_budget(mid, 3, "full", 300, held=True) == 300  # the ceiling still wins
