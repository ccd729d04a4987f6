"""The transformers policy holds each row to the answer's shape while it samples (`SamplingParams.structured`):
real forward passes of the tiny models. An untaught model, which writes garbage freely, writes only what the
answer's language allows; the taught one, asked for a variant more than it was taught, writes every answer whole
(exactly m variants); each stored logprob is the log of the warped distribution restricted to the allowed tokens
and renormalised (recomputed from a forward pass, on rows where the mask removed the model's most likely token);
and sampling free text is what it was before the answer's shape could be held (the same tokens for a seed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from evolve.group_sampler import structured_by
from evolve.prompts import parse_completion
from policies.answer_grammar import AnswerShape
from policies.answer_matcher import AnswerMatcher
from policies.policy import SamplingParams
from policies.transformers_policy import TransformersPolicy
from tests.helpers import SQUARE_SEED, save_tiny
from tests.test_grammar_sampling import torch_warped

pytestmark = pytest.mark.slow
PROMPT = "Square the input."
FULL3, DIFF3 = AnswerShape(3, "full", "python"), AnswerShape(3, "diff", "python")


def held(shape: AnswerShape, max_new_tokens: int, seed: int, stop: bool = True, free: bool = False) -> SamplingParams:
    """The engine's settings for a group of `shape`, its last closing tag as the stop string (`free`: the same
    without the shape held)."""
    stops = (f"</variant {shape.variants}>",) if stop else ()
    return SamplingParams(1.0, 0.9, max_new_tokens, seed=seed, stop=stops, structured=None if free else shape)


@pytest.fixture(scope="module")
def random_policy(tmp_path_factory):
    return TransformersPolicy.load(str(save_tiny(tmp_path_factory.mktemp("random"))))


@pytest.fixture(scope="module")
def taught(tiny_model_dir):
    from tests.conftest import tiny_pairs

    return TransformersPolicy.load(str(tiny_model_dir)), tiny_pairs()[0][0]  # taught to answer with 2 variants


def test_the_policy_says_it_holds_both_edit_formats_and_the_run_says_its_answers_are_held(random_policy):
    from types import SimpleNamespace

    from evolve.cli.run_cmd import _structured_line

    assert structured_by(random_policy) == ("full", "diff")
    member = SimpleNamespace(name=random_policy.name, policy=random_policy)
    search = SimpleNamespace(loop=SimpleNamespace(options=SimpleNamespace(structured="auto"), members=[member]))
    assert _structured_line(search) == (
        "structured sampling: auto: every answer is held to its tags and fences while it is sampled"
    )


@pytest.mark.parametrize("shape", [FULL3, AnswerShape(2, "diff")], ids=["full", "diff"])
def test_an_untaught_model_held_to_the_shape_writes_only_what_the_answer_allows(random_policy, shape):
    matcher = AnswerMatcher(shape)
    group = random_policy.generate(PROMPT, held(shape, 60, seed=3), 3)
    free = random_policy.generate(PROMPT, held(shape, 60, seed=3, free=True), 3)
    for g, plain in zip(group, free, strict=True):
        assert len(g.token_ids) == len(g.logprobs) == 60 and g.finish_reason == "length"
        assert matcher.advance(matcher.start(), g.text) is not None, g.text  # a prefix of a well-formed answer
        assert g.text.startswith("<variant 1>\n")
        assert matcher.advance(matcher.start(), plain.text) is None  # freely, it writes garbage


@pytest.mark.parametrize("shape", [FULL3, DIFF3], ids=["full", "diff"])
def test_every_held_answer_that_ends_parses_into_exactly_m_variants(taught, shape):
    policy, prompt = taught
    group = policy.generate(prompt, held(shape, 320, seed=5), 4)
    free = policy.generate(prompt, held(shape, 320, seed=5, free=True), 4)
    for g in group:
        assert g.finish_reason == "stop" and g.text.endswith("</variant 3>"), g.text
        statuses = [v.status for v in parse_completion(SQUARE_SEED, g.text, 3)]
        assert "parse_error" not in statuses, (statuses, g.text)
    # freely it writes the two variants it was taught, then ends its turn: the third is missing
    assert all(parse_completion(SQUARE_SEED, g.text, 3)[2].status == "parse_error" for g in free)


def test_a_complete_answer_takes_only_an_end_of_turn(taught):
    policy, prompt = taught
    for g in policy.generate(prompt, held(FULL3, 320, seed=5, stop=False), 2):
        assert g.finish_reason == "stop" and g.token_ids[-1] in policy.eos_ids
        assert g.text.endswith("</variant 3>")  # the end of turn came right after the last tag


@pytest.mark.parametrize("which", ["random", "taught"])
def test_stored_logprobs_are_those_of_the_masked_renormalised_distribution(request, random_policy, which):
    if which == "random":
        policy, prompt = random_policy, PROMPT
    else:
        policy, prompt = request.getfixturevalue("taught")
    params = held(FULL3, 200, seed=7)
    prompt_ids = policy.tokenizer(policy.render(prompt), add_special_tokens=False).input_ids
    removed = fallbacks = 0
    group = policy.generate(prompt, params, 3)
    tokenizer, vocab = policy.tokenizer, policy.model.config.vocab_size
    texts = [None if i in tokenizer.all_special_ids else tokenizer.decode([i]) for i in range(vocab)]
    matcher = AnswerMatcher(FULL3)
    for g in group:
        ids = torch.tensor([prompt_ids + g.token_ids])
        with torch.no_grad():
            logits = policy.model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
        state = matcher.start()
        for at, (token, stored) in enumerate(zip(g.token_ids, g.logprobs, strict=True)):
            allowed = torch.tensor(
                [t is not None and matcher.advance(state, t) is not None for t in texts]
                if not matcher.complete(state)
                else [i in policy.eos_ids for i in range(vocab)]
            )
            warped = torch_warped(logits[at], params)
            kept = warped * allowed
            if kept.sum() > 0:
                expected = kept / kept.sum()
            else:  # no token of the nucleus allowed: top-p among the allowed tokens alone
                fallbacks += 1
                expected = torch_warped(logits[at].masked_fill(~allowed, float("-inf")), params)
            assert stored == pytest.approx(float(expected[token].log()), abs=1e-4), (at, texts[token])
            if not allowed[int(logits[at].argmax())]:
                removed += 1  # the model's most likely token was masked out...
                assert abs(stored - float(warped[token].clamp(min=1e-30).log())) > 0.01  # ...and it counts
            if token not in policy.eos_ids:
                state = matcher.advance(state, texts[token])
    assert removed > 0, removed
    assert which == "random" or fallbacks > 0, fallbacks


# What the free-text sampler drew before the answer's shape could be held (tiny_model(seed=0), torch 2.13 on a
# CPU): the same seed must give the same tokens and logprobs. A torch or transformers upgrade that changes the
# random model's weights or the generator's stream changes them too; record them again then, from the code as it
# stands before any change to the free-text path.
FREE_TEXT = [
    (
        SamplingParams(0.9, 0.9, 16, seed=11),
        [[210, 5, 172, 24, 156, 253, 215, 6, 112, 187, 220, 2, 77, 95, 175, 124],
         [3, 3, 3, 128, 71, 141, 103, 60, 191, 255, 31, 156, 130, 176, 186, 122]],
        [-5.5956, -5.1121, -5.3976, -5.7747],
    ),
    (
        SamplingParams(1.2, 0.95, 16, seed=3, top_k=40),
        [[250, 27, 173, 197, 83, 173, 105, 60, 127, 175, 45, 177, 140, 2, 216, 155],
         [170, 197, 190, 198, 205, 124, 8, 8, 209, 220, 104, 107, 250, 236, 27, 170]],
        [-3.6676, -3.7907, -3.7318, -3.6894],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("params", "tokens", "first_logprobs"), FREE_TEXT, ids=["top-p", "top-k"])
def test_free_text_sampling_draws_the_same_tokens_as_before(random_policy, params, tokens, first_logprobs):
    group = random_policy.generate(PROMPT, params, 2)
    assert [g.token_ids for g in group] == tokens
    assert group[0].logprobs[:4] == pytest.approx(first_logprobs, abs=1e-3)


def test_a_row_whose_answer_allows_nothing_more_ends_where_it_stands(random_policy):
    """A model whose vocabulary has no end-of-turn id: once its answer is complete nothing may follow, and the
    row ends there without a token more."""
    from policies.held_rows import HeldSampler, HeldVocab, VocabTexts
    from policies.stops import RowStops

    shape = AnswerShape(1, "full")
    answer = "<variant 1>\n```\nx\n```\n</variant 1>"
    texts = VocabTexts.of(random_policy.tokenizer, 256, random_policy.eos_ids)  # the byte tokens, no EOS
    row = HeldVocab(shape, texts).row()
    for token in random_policy.tokenizer(answer, add_special_tokens=False).input_ids:
        row.accept(token)
    stops = RowStops(random_policy.tokenizer, prompt_len=2)
    sampler = HeldSampler(SamplingParams(1.0, 0.9, 8, seed=1), [row], stops, random_policy.eos_ids)
    sampler(torch.zeros((1, 2 + 40), dtype=torch.long), torch.zeros((1, 256)))
    assert stops.ended == {0: 40} and stops.reasons == {0: "stop"} and sampler.logprobs == [[]]
    assert np.all(row.allowed(np.arange(256)) == 0)
