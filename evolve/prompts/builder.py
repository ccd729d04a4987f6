"""The prompt: problem, parent blocks with their named score vector and feedback, inspirations, and the ask."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evolve.problem.blocks import find_blocks

FEEDBACK_CAP = 1500


@dataclass(frozen=True)
class PromptInputs:
    description: str
    parent_code: str
    parent_scores: Mapping[str, float]
    parent_feedback: str | None
    inspirations: Sequence[tuple[str, Mapping[str, float]]]  # (code, scores)
    variants: int
    edit_format: str  # "diff" or "full"


def _vector(scores: Mapping[str, float], limit: int = 24) -> str:
    items = list(scores.items())
    text = ", ".join(f"{k}={v:.4g}" for k, v in items[:limit])
    return text + (f", … ({len(items) - limit} more)" if len(items) > limit else "")


def _blocks(code: str) -> str:
    blocks = find_blocks(code)
    if len(blocks) == 1:
        return f"```python\n{blocks[0].text.rstrip()}\n```"
    return "\n".join(f"Block {b.index + 1}:\n```python\n{b.text.rstrip()}\n```" for b in blocks)


def _ask(m: int, edit_format: str, n_blocks: int) -> str:
    tags = " ".join(f"<variant {k}>…</variant {k}>" for k in range(1, m + 1))
    many = "s" if m > 1 else ""
    head = (
        f"Write {m} variant{many} of the editable code. "
        + ("Each variant must try a clearly different idea. " if m > 1 else "")
        + f"Wrap each one in its tag: {tags}.\n"
    )
    if edit_format == "diff":
        return head + (
            "Inside a variant, give one or more edits in exactly this form, where SEARCH copies lines of the "
            "current editable code exactly:\n<<<<<<< SEARCH\n(lines to find)\n=======\n(new lines)\n"
            ">>>>>>> REPLACE\n"
        )
    blocks = "one ```python fenced block" if n_blocks == 1 else f"{n_blocks} ```python fenced blocks, in order"
    return head + f"Inside a variant, give {blocks} holding the complete new editable code.\n"


def build_prompt(p: PromptInputs) -> str:
    parts = [
        "# Problem",
        p.description.strip(),
        "# Current program",
        f"Scores (higher is better unless the problem says otherwise): {_vector(p.parent_scores)}",
        "Editable code:",
        _blocks(p.parent_code),
    ]
    if p.parent_feedback:
        parts += ["Evaluator feedback:", p.parent_feedback.strip()[:FEEDBACK_CAP]]
    for i, (code, scores) in enumerate(p.inspirations, 1):
        parts += [f"# Other program {i}", f"Scores: {_vector(scores)}", _blocks(code)]
    parts += ["# Task", _ask(p.variants, p.edit_format, len(find_blocks(p.parent_code)))]
    return "\n\n".join(parts)
