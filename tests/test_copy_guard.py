"""The copy guard (policies/copy_guard.py): a fenced block that is writing a known code again is turned off it
where the model, at its sampling temperature, gives tokens that leave every known code at least `DOUBT` of its mass
at a point of code in a body, and only there; the draw then keeps to the tokens that leave, from the distribution
held to them, so the stored logprob is exact; and on the llama.cpp and transformers policies, a guarded group writes
none of the codes it was told to avoid where the same group unguarded (same seed) writes them."""

from __future__ import annotations

import re
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import torch

from policies.answer_grammar import AnswerShape, answer_gbnf
from policies.copy_guard import DOUBT, GroupGuard, RowGuard, TokenTexts, both, comparable, squeeze
from policies.policy import SamplingParams
from policies.sampling import TokenSampler, constrained_distribution

PARENT = 'def solve(x):\n    """Add one."""\n    return x + 1  # the seed\n'
BODY = 'def solve(x):\n    """Add one."""\n    '
OPEN = "<variant 1>\n```python\n"


def row_at(written: str, tokens: list[str], known=(PARENT,), comment="#", fence=OPEN) -> RowGuard:
    """A row that has written `written` inside its first fenced block, over a toy vocabulary of `tokens`."""
    guard = RowGuard(GroupGuard.of(list(known), comment), TokenTexts(tokens))
    guard.write(fence + written)
    return guard


def turned(guard: RowGuard, probs: list[float], temperature: float = 1.0) -> list[int] | None:
    """The toy tokens the guard lets the row take next, or None where it holds nothing."""
    allowed = guard.turn(np.log(np.array(probs)), temperature)
    return None if allowed is None else np.flatnonzero(allowed(np.arange(len(probs)))).tolist()


def test_where_the_model_doubts_a_copy_at_a_point_of_code_only_the_tokens_that_leave_it_may_come():
    tokens = ["return", "yield", "  ", "#", "ret", "\n    raise", "x"]
    guard = row_at(BODY, tokens)
    # "return" and "ret" continue the parent, "  " is layout, "#" opens a comment: none of them leaves the copy
    assert turned(guard, [0.5, 0.1, 0.1, 0.1, 0.1, 0.05, 0.05]) == [1, 5, 6]
    assert guard.group.counts.turned == 1


def test_a_copy_the_model_is_sure_of_is_left_alone_and_the_doubt_is_judged_at_the_sampling_temperature():
    tokens = ["return", "yield"]
    guard = row_at(BODY, tokens)
    assert turned(guard, [1 - DOUBT / 2, DOUBT / 2]) is None
    assert turned(guard, [1 - DOUBT / 2, DOUBT / 2], temperature=2.0) == [1]  # flatter: more mass leaves
    assert guard.group.counts.turned == 1


def test_no_turn_inside_the_known_code_s_strings_or_comments_nor_after_it_ends_nor_off_it():
    tokens = ["Add", "Sub"]
    for written in ('def solve(x):\n    """', PARENT[:-6], PARENT.rstrip("\n"), "def solve(y):\n    "):
        assert turned(row_at(written, tokens), [0.5, 0.5]) is None, written
    outside = RowGuard(GroupGuard.of([PARENT], "#"), TokenTexts(tokens))
    outside.write("<variant 1>\n")
    assert turned(outside, [0.5, 0.5]) is None


def test_no_turn_outside_a_body_and_an_import_line_written_first_leaves_the_copy_guarded():
    """The embedded model's usual way off a copy at its first line was a new import before the parent's code
    verbatim: a child that runs as its parent. Outside a body nothing is turned; an import line is not compared."""
    tokens = ["import", "def", "return", "yield"]
    for written in ("", "def solve(", "import math\n\ndef solve(x):\n"):
        assert turned(row_at(written, tokens), [0.25] * 4) is None, written
    imported = row_at("import math\nfrom os import path\n" + BODY, tokens)
    assert turned(imported, [0.25] * 4) == [1, 3]  # "return" continues the parent; an import line is no way out
    c_code = "int f(int x) {\n  return x + 1;\n}"
    in_braces = row_at("#include <math.h>\nint f(int x) {\n  ", tokens, [c_code], "//", "<variant 1>\n```c\n")
    assert turned(in_braces, [0.25] * 4) == [1, 3]
    assert turned(row_at("int f(int x) ", tokens, [c_code], "//", "<variant 1>\n```c\n"), [0.25] * 4) is None


def test_no_way_out_through_a_comment_a_lead_comment_line_or_a_token_the_grammar_refuses():
    c_code = "int f(int x) {\n  return x + 1;\n}"
    c_tokens = ["/", "/*", "//", "int", "return"]
    in_c = row_at("int f(int x) {\n  ", c_tokens, [c_code], "//", "<variant 1>\n```c\n")
    assert turned(in_c, [0.2] * 5) == [3]  # "/" may open a comment as "/*" and "//" do
    # a lead comment (`# Change: ...`) or a note above a copied line does not hide the copy
    led = row_at("# Change: a tweak\n" + BODY + "# note\n    ", ["return", "yield"])
    assert turned(led, [0.5, 0.5]) == [1]
    # the doubt counts only tokens the row's grammar allows: a refused leaving token turns nothing
    guard = row_at(BODY, ["return", "<|im_end|>", "yield"])
    grammar = lambda ids: ids != 1  # noqa: E731
    assert guard.turn(np.log(np.array([0.9, 0.0999, 0.0001])), 1.0, grammar) is None
    assert guard.turn(np.log(np.array([0.9, 0.0001, 0.0999])), 1.0, grammar) is not None


def test_a_form_feed_line_does_not_shift_where_the_strings_are():
    known = "\x0c\ndef solve(x):\n    s = 'abc'\n    return s\n"
    inside = row_at("def solve(x):\n    s = 'a", ["bc'", "zz'"], [known])
    assert turned(inside, [0.5, 0.5]) is None  # inside the string literal: nothing to turn


def test_a_block_one_row_finishes_is_known_to_every_row_of_the_group_from_then_on():
    tokens = ["2", "3"]
    group = GroupGuard.of([PARENT], "#")
    first, second = RowGuard(group, TokenTexts(tokens)), RowGuard(group, TokenTexts(tokens))
    for piece in (OPEN, "def solve(x):\n    return x * ", "2", "\n```", "\n</variant 1>"):
        first.write(piece)
    assert group.known[-1].squeezed == "defsolve(x):returnx*2" and group.counts.learned == 1
    second.write(OPEN + "def solve(x):\n    return x *")
    assert turned(second, [0.5, 0.5]) == [1]  # "2" would write the first row's block again


def test_a_turned_draw_carries_the_logprob_of_the_held_distribution_it_follows():
    """The likeliest tokens copy: the nucleus holds none that leaves, so the draw is warped among those that do
    (policies.sampling.constrained_distribution's second case), and its logprob is that distribution's."""
    tokens = ["return", "ret", "yield", "raise", "pass", "#"]
    logits = np.log(np.array([0.7, 0.2, 0.04, 0.03, 0.02, 0.01])).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=1, seed=5)
    sampler = TokenSampler(params)
    draws = []
    for _ in range(6000):
        guard = row_at(BODY, tokens)
        allowed = both(None, guard.turn(logits, params.temperature))
        assert allowed is not None
        draws.append(sampler.draw_held(logits, allowed))
    leaving = np.array([0, 0, 0.04, 0.03, 0.02, 0]) / 0.09
    expected = np.where(np.cumsum(leaving) - leaving < 0.9, leaving, 0)  # top-p among the leaving tokens
    expected /= expected.sum()
    counts = np.bincount([token for token, _ in draws], minlength=6) / len(draws)
    np.testing.assert_allclose(counts, expected, atol=0.025)
    for token, logprob in draws[:50]:
        assert logprob == pytest.approx(np.log(expected[token]), abs=1e-6)  # float32 logits


# ---- the llama.cpp policy on the taught tiny model -----------------------------------------------------------
LOGPROB_BOUND = 2e-3  # float32 GGUF against float32 torch (as tests/test_grammar_sampling.py)


def blocks(text: str) -> list[str]:
    return [squeeze(part.split("\n", 1)[1]) for part in text.split("```")[1::2] if "\n" in part]


@pytest.mark.slow
def test_a_guarded_group_writes_none_of_the_codes_it_avoids_and_stores_the_logprobs_it_drew_from(
    tiny_gguf, tiny_model_dir
):
    from policies.from_spec import make_policy
    from policies.transformers_policy import TransformersPolicy
    from tests.conftest import tiny_pairs

    llama = make_policy(f"llama:{tiny_gguf}")
    local = TransformersPolicy.load(str(tiny_model_dir))
    taught = tiny_pairs()[0][0]
    avoid = ("def solve(x):\n    return x * x", "def solve(x):\n    return x ** 2")
    shape = AnswerShape(2, "full", "python")
    free = SamplingParams(1.0, 0.95, 120, seed=11, stop=("</variant 2>",), structured=shape)
    guarded = replace(free, avoid=avoid)
    avoided = {squeeze(code) for code in avoid}
    try:
        unguarded = llama.generate(taught, free, 8)
        group = llama.generate(taught, guarded, 8)
        assert sum(b in avoided for g in unguarded for b in blocks(g.text)) >= 2  # what the guard has to prevent
        written = [b for g in group for b in blocks(g.text)]
        assert len(written) >= 8 and not avoided & set(written), written
        assert llama.copy_guard.turned > 0
        # One row alone (it learns only its own blocks) replayed against the torch model's logits: each stored
        # logprob is that of the held distribution with the guard's mask applied, the turns included.
        prompt_ids = local.tokenizer(local.render(taught), add_special_tokens=False).input_ids
        turns = 0
        for seed in range(12, 18):
            (g,) = llama.generate(taught, replace(guarded, seed=seed), 1)
            with torch.no_grad():
                logits = local.model(input_ids=torch.tensor([prompt_ids + g.token_ids])).logits[0].float()
            logits = logits[len(prompt_ids) - 1 : -1].numpy()
            row = llama.grammars.row(answer_gbnf(shape))
            guard = RowGuard(GroupGuard.of(list(avoid), "#"), llama.guard_texts())
            try:
                for at, (token, stored) in enumerate(zip(g.token_ids, g.logprobs, strict=True)):
                    allowed = both(row.allowed, guard.turn(logits[at], guarded.temperature, row.allowed))
                    held = constrained_distribution(logits[at], guarded, allowed)
                    assert held is not None
                    support, probs = held
                    assert token in support.tolist()
                    expected = probs[support.tolist().index(token)]
                    assert stored == pytest.approx(float(np.log(expected)), abs=LOGPROB_BOUND)
                    row.accept(token)
                    guard.accept(token)
            finally:
                row.close()
            turns += guard.group.counts.turned
        assert turns > 0
    finally:
        llama.close()


@pytest.mark.slow
def test_the_transformers_policy_guards_its_held_rows_too(tiny_model_dir):
    from policies.transformers_policy import TransformersPolicy
    from tests.conftest import tiny_pairs

    local = TransformersPolicy.load(str(tiny_model_dir))
    taught = tiny_pairs()[0][0]
    avoid = ("def solve(x):\n    return x * x", "def solve(x):\n    return x ** 2")
    free = SamplingParams(1.0, 0.95, 120, seed=11, stop=("</variant 2>",), structured=AnswerShape(2, "full", "python"))
    avoided = {squeeze(code) for code in avoid}
    unguarded = local.generate(taught, free, 8)
    assert sum(b in avoided for g in unguarded for b in blocks(g.text)) >= 2
    group = local.generate(taught, replace(free, avoid=avoid), 8)
    written = [b for g in group for b in blocks(g.text)]
    assert len(written) >= 8 and not avoided & set(written), written
    assert local.copy_guard.turned > 0


def test_the_run_says_whether_copies_are_guarded_and_which_members_cannot():
    from types import SimpleNamespace

    from evolve.cli.run_cmd import _copy_guard_line
    from policies.copy_guard import GuardCounts

    def search(structured: str, guard: bool, *policies: object):
        members = [SimpleNamespace(name=f"m{i}", policy=p) for i, p in enumerate(policies)]
        options = SimpleNamespace(structured=structured, copy_guard=guard)
        return SimpleNamespace(loop=SimpleNamespace(options=options, members=members))

    guarding, server = SimpleNamespace(copy_guard=GuardCounts()), SimpleNamespace()
    assert _copy_guard_line(search("off", True, guarding)) is None
    assert _copy_guard_line(search("auto", False, guarding)).startswith("copy guard: off (--no-copy-guard)")
    on = _copy_guard_line(search("auto", True, guarding))
    assert on.startswith("copy guard: on:") and "cannot" not in on
    assert _copy_guard_line(search("on", True, guarding, server)).endswith(
        "(m1 cannot: its copies are caught as duplicates only)"
    )


class WholeTextRow:
    """The guard's first design, kept as the reference: everything read again from the whole text at every token
    (its fences found left to right without overlap, as str.count counts them)."""

    def __init__(self, group: GroupGuard) -> None:
        self.group, self.text = group, ""

    def fences(self) -> list[int]:
        return [m.start() for m in re.finditer("```", self.text)]

    def write(self, piece: str) -> None:
        before = len(self.fences())
        self.text += piece
        fences = self.fences()
        for j in range(before, len(fences)):  # every block this piece closes, one piece may close several
            if j % 2:
                body = self.text[fences[j - 1] + 3 : fences[j]]
                self.group.learn(body.split("\n", 1)[1] if "\n" in body else "")

    def rests(self) -> list[str] | None:
        fences = self.fences()
        if len(fences) % 2 == 0:
            return None
        newline = self.text.find("\n", fences[-1] + 3)
        if newline < 0:
            return None
        written = comparable(self.text[newline + 1 :], self.group.comment)
        copied = [k for k in self.group.known if k.squeezed.startswith(written)]
        at = len(written)
        if not copied or any(at >= len(k.squeezed) or not k.turnable[at] for k in copied):
            return None
        return [k.squeezed[at:] for k in copied]


def test_the_row_s_running_view_equals_the_whole_text_read_again_at_every_token():
    """Fences split over tokens and run together, line ends of every kind, import and comment lines, and blocks a
    sibling finishes mid-row: after every piece, what is left of each copied code is what reading the whole text
    again gives."""
    other = "def solve(x):\n    y = x * 2\n    return y\n"
    long_line = "def solve(x):\n    return " + " + ".join(f"x * {k}" for k in range(60)) + "\n"  # past UNREAD_PREFIX
    lines = [*PARENT.splitlines(keepends=True), *other.splitlines(keepends=True), *long_line.splitlines(True)]
    extras = ["```", "``", "`", "```python\n", "\n", "\r", "\r\n", "\x0c", "import os\n", "# note\n", "  ", "x"]
    extras += ["``````", "```\n```python\n", "```python\nx = 1\n```"]  # pieces holding several fences
    extras += ["from " + "m" * 300 + " import z\n", " " * 300 + "import os\n"]  # judged by their first characters
    rng = np.random.default_rng(0)
    for trial in range(150):
        pieces: list[str] = ["<variant 1>\n"]
        for _ in range(int(rng.integers(5, 40))):
            if rng.random() < 0.3:  # a known code from its start, in pieces, as a copy is written
                code = [PARENT, other, long_line][int(rng.integers(3))]
                cuts = sorted({0, len(code), *(int(c) for c in rng.integers(0, len(code), 8))})
                pieces += ["```python\n", *(code[a:b] for a, b in pairwise(cuts))]
            elif rng.random() < 0.6:
                line = lines[int(rng.integers(len(lines)))]
                cut = sorted(int(c) for c in rng.integers(0, len(line) + 1, 2))
                pieces += [line[: cut[0]], line[cut[0] : cut[1]], line[cut[1] :]]
            else:
                pieces.append(extras[int(rng.integers(len(extras)))])
        fast_group, slow_group = GroupGuard.of([PARENT, long_line], "#"), GroupGuard.of([PARENT, long_line], "#")
        fast, slow = RowGuard(fast_group, TokenTexts([])), WholeTextRow(slow_group)
        for k, piece in enumerate(pieces):
            if k == len(pieces) // 2:  # a sibling finishes a block mid-row
                fast_group.learn(other)
                slow_group.learn(other)
            fast.write(piece)
            slow.write(piece)
            assert fast.rests() == slow.rests(), (trial, k, fast.text)
        assert [c.squeezed for c in fast_group.known] == [c.squeezed for c in slow_group.known]


def test_a_row_s_unfinished_line_is_read_once_however_long_it_grows(monkeypatch):
    """A model that writes one line of 5,000 one-character tokens, copying a known code's long line: each
    character is compared once, not once per token (the guard read the whole unfinished line again at every
    token: 12.5 million characters here, 1.3 ms a token at 10,000: benchmarks/copy_guard_speed.py)."""
    import policies.copy_guard as copy_guard

    known = "def solve(x):\n    return " + " + ".join(f"x * {k % 7}" for k in range(700)) + "\n"
    line = known.splitlines(keepends=True)[1][:5000]
    read = [0]
    real_squeeze = copy_guard.squeeze

    def counted(text: str) -> str:
        read[0] += len(text)
        return real_squeeze(text)

    guard = row_at("def solve(x):\n", [], known=(known,))
    monkeypatch.setattr(copy_guard, "squeeze", counted)
    for ch in line:
        guard.write(ch)
        assert guard.rests() is not None  # still a copy, turnable, at every token
    assert read[0] <= 2 * len(line)
    guard.write("x")  # leaves the copy mid-line
    assert guard.rests() is None


def test_a_fenced_block_under_a_file_s_header_or_in_a_diff_answer_is_guarded_as_any_other():
    """A program of several files: its blocks are the known codes (evolve.group_sampler.copy_guard_codes), and a row
    copying one under its file's header is judged as a one-file row is; an edit outside any fence is not judged."""
    from evolve.group_sampler import copy_guard_codes
    from evolve.problem import load_problem
    from policies.answer_grammar import AnswerShape
    from policies.copy_guard import GuardCounts, group_guard

    seed = load_problem(Path(__file__).resolve().parents[1] / "problems" / "knapsack_files").seed_code
    codes = copy_guard_codes([seed])
    assert [c.split("\n")[0] for c in codes] == ["def fill_fraction():", "def order(items):"]
    for edit_format in ("full", "diff"):
        shape = AnswerShape(1, edit_format, "python", files=("lib/a.py",))
        params = SamplingParams(0.7, 0.95, 200, avoid=codes, structured=shape)
        guard = group_guard(params, GuardCounts())
        assert guard is not None
        row = RowGuard(guard, TokenTexts([]))
        row.write("<variant 1>\n=== FILE: lib/params.py ===\n```python\n" + codes[0].removesuffix("0.6"))
        assert row.rests() == ["0.6"]
        edit = RowGuard(guard, TokenTexts([]))
        edit.write("<variant 1>\n=== FILE: lib/params.py ===\n<<<<<<< SEARCH\n" + codes[0].removesuffix("0.6"))
        assert edit.rests() is None
