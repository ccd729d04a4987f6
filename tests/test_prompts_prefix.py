"""The prompt's layout for a prompt cache: two groups of one run, on different parents, share the tokens of
everything fixed for the run (the problem's text, the ask's rules, format and directions), so that llama.cpp's
prompt cache decodes only the rest on every group but the first."""

from __future__ import annotations

from pathlib import Path

from evolve.problem import load_problem
from evolve.prompts import PromptInputs, ShownProgram, build_prompt
from policies.policy import chat_token_ids

ROOT = Path(__file__).resolve().parent.parent


def _bpe_tokenizer(corpus: list[str]):
    """A real byte-level BPE tokenizer trained on the prompts themselves: its merges span line breaks and
    headings, so a boundary between fixed and variable text is tokenised as a real model's tokenizer would."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok)


def _shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_prompts_of_two_parents_share_a_token_prefix_covering_the_fixed_part():
    problem = load_problem(ROOT / "problems" / "roman_numerals")
    seed, names = problem.seed_code, problem.component_names
    child = seed.replace('(10, "X")', '(50, "L"), (10, "X")')
    first = build_prompt(
        PromptInputs(
            problem.config.description, seed, dict.fromkeys(names, 0.0), None, [ShownProgram(seed, {})], 3, "full"
        )
    )
    second = build_prompt(
        PromptInputs(
            problem.config.description,
            child,
            {name: float(i % 2) for i, name in enumerate(names)},
            "case t_003 wrong",
            [ShownProgram(seed, dict.fromkeys(names, 0.0))],
            3,
            "full",
            recent=[seed.replace("out = ", "out: str = ")],
        )
    )
    tokenizer = _bpe_tokenizer([first, second])
    a, b = chat_token_ids(tokenizer, first), chat_token_ids(tokenizer, second)
    common = tokenizer.decode(a[: _shared(a, b)])
    # the fixed part: the problem's text, then the ask's rules, its directions and format, to their last line
    fixed_end = first.index("holding the complete new editable code.") + len("holding the complete new editable code.")
    assert problem.config.description.strip() in common
    for rule in ("Every variant must change the code", "Variant 3: ", "Wrap each one in its tag"):
        assert rule in common
    assert len(common) >= fixed_end
    assert first[:fixed_end] == second[:fixed_end]
    # and the parent's code comes after it, so it is not part of what stays cached
    assert '(50, "L")' not in common and first.index("Editable code:") > fixed_end
    # the closing line still asks for the variants last, for a small model that follows what it read last
    assert second.rstrip().endswith("differ from each other and from the recent children above.")
    assert "Now write the 3 variants" in second.splitlines()[-1]


def test_a_run_of_components_with_one_value_is_written_as_a_range():
    names = [f"t_{i:03d}" for i in range(24)]
    scores = {name: 1.0 if 3 <= i < 20 else 0.0 for i, name in enumerate(names)}
    scores["t_010"] = 0.25
    text = build_prompt(PromptInputs("d", "def solve(n):\n    return n\n", scores, None, [], 2, "full"))
    line = next(line for line in text.splitlines() if line.startswith("Scores"))
    assert line.endswith("t_000…t_002=0, t_003…t_009=1, t_010=0.25, t_011…t_019=1, t_020…t_023=0")
