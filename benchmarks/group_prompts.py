"""The prompts of consecutive groups of one run, for the speed benchmarks: each group has another parent.

A run's first group is posed on the seed; later ones on children of it, with their own scores, and the
programs met so far as inspirations. The children here are made by a fixed edit of the seed's editable code
(a marked comment, and the numbers of one literal changed), so that every prompt differs from the previous
one from the parent's scores on, as in a real run, while the problem's text and the ask stay the same.

`python -m benchmarks.group_prompts [--problem DIR] [--groups N]` prints, per group, the prompt's tokens under
the embedded model's chat template and how many of them open the previous group's prompt too (what
llama.cpp's prompt cache skips), then `group_prompts groups=N first_tokens=... later_shared=...` (the share of
the later prompts' tokens that open the previous one). `--model DIR` reads another model's tokenizer (the smoke
run's tiny one).
"""

from __future__ import annotations

import argparse
import random
import re
from dataclasses import dataclass

from evolve.problem import load_problem
from evolve.prompts.builder import PromptInputs, ShownProgram, build_prompt, resolve_edit_format

KIND = "speed"
SMOKE_ARGS = ("--model", "{tiny_model}", "--groups", "2")

VARIANTS = 3


def child_of(seed: str, k: int) -> str:
    """The seed with its k-th fixed edit: a comment naming the attempt at the top of the editable code, and the
    first integer literal inside the editable code raised by k (the kind of small change children carry)."""
    start = seed.index("EVOLVE-BLOCK-START")
    head_end = seed.index("\n", start) + 1
    body = seed[head_end:]
    body = re.sub(r"\b(\d+)\b", lambda m: str(int(m.group(1)) + k), body, count=1)
    return seed[:head_end] + f"# attempt {k}: a variation of the seed\n" + body


@dataclass(frozen=True)
class GroupAsk:
    """One group's prompt and what its answers are read against: the parent, the edit format the prompt asks
    for, its fences' language tag (what a grammar of the answer's shape needs), and whether the problem's programs
    are of several files (the parser's `multi_file`)."""

    prompt: str
    parent: str
    edit_format: str
    fence_tag: str
    multi_file: bool = False


def group_asks(problem_dir: str, groups: int, edit_format: str = "full") -> list[GroupAsk]:
    """The asks of `groups` consecutive groups: the seed as the first parent, then child k as the k-th."""
    problem = load_problem(problem_dir)
    names = problem.component_names
    seed = problem.seed_code
    asks = []
    for k in range(groups):
        parent = seed if k == 0 else child_of(seed, k)
        draw = random.Random(k)  # per-case scores of 0 or 1, as a problem scored per hidden case has
        scores = {name: float(draw.random() < 0.3 + 0.1 * k) for name in names}
        met = [seed, *(child_of(seed, j) for j in range(1, k))][-2:]
        inspirations = [ShownProgram(code, {name: 0.5 for name in names}) for code in (met if k else [seed, seed])]
        several = problem.multi_file
        text = problem.config.description
        inputs = PromptInputs(text, parent, scores, None, inspirations, VARIANTS, edit_format, multi_file=several)
        fmt = resolve_edit_format(edit_format, parent)
        asks.append(GroupAsk(build_prompt(inputs), parent, fmt, inputs.fence_tag, problem.multi_file))
    return asks


def group_prompts(problem_dir: str, groups: int, edit_format: str = "full") -> list[str]:
    """The prompts of `groups` consecutive groups (`group_asks`)."""
    return [ask.prompt for ask in group_asks(problem_dir, groups, edit_format)]


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    from transformers import AutoTokenizer

    from policies.embedded import embedded_model_dir
    from policies.policy import chat_token_ids

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problem", default="problems/roman_numerals")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--model", default=None, help="a model folder's tokenizer (default: the embedded one)")
    args = ap.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.model or embedded_model_dir())
    previous: list[int] = []
    tokens, shared = [], []
    for k, prompt in enumerate(group_prompts(args.problem, args.groups)):
        ids = chat_token_ids(tokenizer, prompt)
        tokens.append(len(ids))
        shared.append(shared_prefix(previous, ids))
        print(f"group {k + 1}: {len(ids)} prompt tokens, {shared[-1]} shared with the previous")
        previous = ids
    later = sum(shared[1:]) / max(sum(tokens[1:]), 1)
    print(f"group_prompts groups={len(tokens)} first_tokens={tokens[0]} later_shared={later:.2f}")


if __name__ == "__main__":
    main()
