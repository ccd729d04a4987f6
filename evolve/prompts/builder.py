"""The prompt: problem, parent blocks with their named score vector, feedback and failures, inspirations, the ask.

Failures teach: the parent's evaluator feedback, the tail of its stderr, its per-case errors and the most recent
failures among its children are shown (each bounded), so the next completion can avoid them. Nothing here
raises on a stored program: a program whose markers are broken is shown whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from evolve.problem.blocks import BlockError, EditableBlock, find_blocks

FEEDBACK_CAP = 1500
STDERR_TAIL = 600  # characters of the parent's stderr / traceback tail
CASE_ERRORS_SHOWN = 5
CASE_ERROR_CAP = 160
FAILURE_LINES = 3  # first lines of each recent child failure
FAILURE_CAP = 300


@dataclass(frozen=True)
class PromptInputs:
    description: str
    parent_code: str
    parent_scores: Mapping[str, float]
    parent_feedback: str | None
    inspirations: Sequence[tuple[str, Mapping[str, float]]]  # (code, scores)
    variants: int
    edit_format: str  # "diff" or "full"
    parent_stderr: str | None = None  # the parent's stderr / traceback (its tail is shown)
    parent_case_errors: Mapping[str, str] | None = None  # case name → error, for cases the parent failed
    recent_failures: Sequence[tuple[str, str]] = ()  # (error kind, error) of this parent's latest failed children


def _vector(scores: Mapping[str, float], limit: int = 24) -> str:
    items = list(scores.items())
    text = ", ".join(f"{k}={v:.4g}" for k, v in items[:limit])
    return text + (f", … ({len(items) - limit} more)" if len(items) > limit else "")


def _safe_blocks(code: str) -> list[EditableBlock]:
    try:
        return find_blocks(code)
    except BlockError:  # an archive written before bad_blocks existed may hold such a program
        return [EditableBlock(0, 0, len(code), code)]


def _blocks(code: str) -> str:
    blocks = _safe_blocks(code)
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
    parts += _failures(p)
    for i, (code, scores) in enumerate(p.inspirations, 1):
        parts += [f"# Other program {i}", f"Scores: {_vector(scores)}", _blocks(code)]
    parts += ["# Task", _ask(p.variants, p.edit_format, len(_safe_blocks(p.parent_code)))]
    return "\n\n".join(parts)


def _first_lines(text: str, lines: int, cap: int) -> str:
    return "\n".join(text.strip().splitlines()[:lines])[:cap]


def _failures(p: PromptInputs) -> list[str]:
    """What went wrong with the parent and its latest children, each part bounded in size."""
    parts: list[str] = []
    if p.parent_stderr and p.parent_stderr.strip():
        parts += ["Its stderr (tail):", p.parent_stderr.strip()[-STDERR_TAIL:]]
    if p.parent_case_errors:
        items = list(p.parent_case_errors.items())
        shown = [f"- {name}: {_first_lines(err, 1, CASE_ERROR_CAP)}" for name, err in items[:CASE_ERRORS_SHOWN]]
        more = [f"- … and {len(items) - CASE_ERRORS_SHOWN} more failed cases"] if len(items) > CASE_ERRORS_SHOWN else []
        parts += ["Cases it failed:", "\n".join(shown + more)]
    if p.recent_failures:
        lines = [f"- {kind}: {_first_lines(err, FAILURE_LINES, FAILURE_CAP)}" for kind, err in p.recent_failures]
        parts += ["Recent attempts from this program that failed (avoid these mistakes):", "\n".join(lines)]
    return parts
