"""The prompt: the problem and the ask's instructions first, then the parent blocks with their named score
vector, feedback and failures, inspirations, the parent's recent children, and a short closing line.

Why this order: everything before the parent is the same for every group of a run (the problem's text, the
variants asked for, their format and directions), so a backend with a prompt cache (llama.cpp's, see
policies/llama_policy.py) computes it once per run and only the part from the parent on per group. The closing
line repeats the ask in one sentence, so the last thing a small model reads is still what to write.

Failures teach: the parent's evaluator feedback, the tail of its stderr, its per-case errors, what its code raised
that the evaluator caught (a catch-all evaluator hides it otherwise) and the most recent failures among its
children (those the evaluator refused too, `zero_child_feedback`) are shown, each bounded
(evolve/prompts/failures.py), so the next completion can avoid them. Nothing here raises on a stored
program: a program whose markers are broken is shown whole.

Small models mostly echo the code they are shown. So the ask says plainly that a copy is wasted, shows what was
already tried from this parent, and (in the `directed` template) gives each variant its own kind of change, which
is what makes the m answers of one completion differ from each other. Where the answer is held to its shape, each
fenced block of a `full` answer opens with a comment naming its change (`# Change: ...`, `lead_comment`): the
prompt says so in one sentence, exactly when evolve/group_sampler.py's `answer_shape` asks the grammar for it.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from evolve.problem.blocks import BlockError, EditableBlock, find_blocks
from evolve.problem.fixed_code import fixed_code_view
from evolve.problem.outcome import SwallowedError
from evolve.prompts.failures import FailureShown, failure_parts
from evolve.prompts.parser import is_python
from evolve.prompts.tree_view import current_program, program_blocks, tree_rules

FEEDBACK_CAP = 1500
RECENT_CAP = 1200  # characters of one recent attempt shown
FULL_REWRITE_MAX_LINES = 40  # editable code up to this long is rewritten whole under edit_format "auto"
TEMPLATES = ("standard", "directed")
OTHERS_VIEWS = ("code", "diff")  # how other programs and recent children are shown (PromptInputs.others_view)
DIFF_CONTEXT = 2  # unchanged lines around each change of a diff view
DIFF_MAX_LINES = 600  # a longer block is shown whole: difflib's time grows faster than its length

# A line's own indentation only (`[^\S\n]`, whitespace but newlines): `^\s*` ran on from every line start over all
# the blank lines after it, so a program (a child: model output) of 10,000 blank lines took 3 s per prompt.
TELLTALES = (
    ("rust", re.compile(r"^[^\S\n]*(?:pub\s+)?fn\s+\w+\s*[(<]", re.M)),
    ("cpp", re.compile(r"^[^\S\n]*#\s*include\s*<(?:iostream|vector|string|algorithm)>|std::", re.M)),
    ("c", re.compile(r"^[^\S\n]*#\s*include\s*[<\"]", re.M)),
)

# One kind of change per variant slot (the `directed` template); cycled when m exceeds the list.
DIRECTIONS = (
    "a small, careful improvement: fix what the feedback shows is wrong, or tune a number or a detail",
    "a different method or algorithm for the same job",
    "a bolder idea, or a combination of the best parts of the other programs",
    "a simpler, cleaner version that scores at least as well",
)


@dataclass(frozen=True)
class ShownProgram:
    """Another program a prompt shows beside the parent: its code and its named scores."""

    code: str
    scores: Mapping[str, float]


@dataclass(frozen=True)
class PromptInputs:
    description: str
    parent_code: str
    parent_scores: Mapping[str, float]
    parent_feedback: str | None
    inspirations: Sequence[ShownProgram]
    variants: int
    edit_format: str  # "diff", "full" or "auto" (see resolve_edit_format)
    parent_stderr: str | None = None  # the parent's stderr / traceback (its tail is shown)
    parent_case_errors: Mapping[str, str] | None = None  # case name → error, for cases the parent failed
    recent_failures: Sequence[FailureShown] = ()  # this parent's latest failed children
    # What the parent's code raised into the evaluator, most frequent first (an evaluator that catches everything
    # and scores 0 says nothing else of it)
    parent_swallowed: Sequence[SwallowedError] = ()
    recent: Sequence[str] = ()  # the code of this parent's latest children: the variants must differ from them
    template: str = "directed"  # one of TEMPLATES
    # The code fences' tag ("python", "c", "rust"); None: told from the parent's code (fence_tag)
    language: str | None = None
    program_view: str = "files"  # a program of several files: "files" or "blocks" ([program] prompt_view)
    # "code": other programs and recent children whole; "diff": only their changes from the parent, which a small
    # model cannot paste back as its answer (whole programs shown were the largest source of its copies)
    others_view: str = "code"
    # The comment prefix ("#", "//") of the line each fenced block must open with, `# Change: ...`, where the answer
    # is held to it (`AnswerShape.lead_comment`, decided with the shape in evolve/group_sampler.py); "": not asked
    lead_comment: str = ""
    # Show a one-file program's code around its blocks, read-only, in the fixed head (evolve/problem/fixed_code.py)
    fixed_code: bool = False
    # The fence language's line comment, for the fixed code's placeholder lines (evolve/group_sampler.py sets it from
    # the grammar's table, which this layer may not import)
    line_comment: str = "#"
    # The editable code's functions the fixed code calls (`priority(job)`, read once from the problem's seed:
    # `interface_calls`), said where the fixed code is shown to be what every variant must define; (): not said
    interface: Sequence[str] = ()
    # Those functions' first calls with real arguments, as the seed's evaluation recorded them (sandboxes/
    # first_calls.py: `priority({'time': 11, ...})`), said after them; (): none recorded, or the interface not said
    interface_examples: Sequence[str] = ()
    # The problem's programs are of several files (`Problem.multi_file`): each is shown as its files, and the ask
    # says how to name the file a change is for. Never told from the code: a one-file program whose text starts
    # with a `=== FILE: ` line is one editable text like any other.
    multi_file: bool = False

    @property
    def fence_tag(self) -> str:
        """`language`, else "python" for a parent that parses as Python, else a tag told from telltale lines
        (`fn name(` is Rust, `#include <` C or C++), else none (the loop passes the problem's language; the guess
        serves callers that do not know it, and a wrong one costs nothing but the tag, which the parser ignores)."""
        if self.language is not None:
            return self.language
        if is_python(self.parent_code):
            return "python"
        return next((tag for tag, telltale in TELLTALES if telltale.search(self.parent_code)), "")


def editable_lines(code: str) -> int:
    return sum(b.text.strip("\n").count("\n") + 1 for b in safe_blocks(code) if b.text.strip())


def resolve_edit_format(edit_format: str, parent_code: str) -> str:
    """`auto`: a whole rewrite for short editable code (easier for a small model than an exact SEARCH copy),
    SEARCH/REPLACE edits for long code (where a rewrite costs many tokens and invites accidental changes)."""
    if edit_format != "auto":
        return edit_format
    return "full" if editable_lines(parent_code) <= FULL_REWRITE_MAX_LINES else "diff"


HELD_ROOM = 1.6  # a held answer's room over a free one's (`completion_budget`)
HELD_MIN_CODE_TOKENS = 128  # and its least room for each variant's code
CHARS_PER_TOKEN = 3  # code tokenises at 3-4 characters a token; the lower figure errs towards a longer budget
VARIANT_OVERHEAD_TOKENS = 48  # tags, a fence and a sentence around each variant
MIN_COMPLETION_TOKENS = 160


def completion_budget(parent_code: str, variants: int, edit_format: str, ceiling: int, held: bool = False) -> int:
    """How many tokens a completion may take: room for `variants` answers, each up to 1.5x the editable code
    (a whole rewrite) or 1x (SEARCH/REPLACE copies part of it twice at most), never more than `ceiling` (the
    problem's max_new_tokens). Why: a group decodes until its longest row ends, and a small model that runs on
    past its last answer would otherwise cost every group the full ceiling. A `held` answer (its shape held by a
    grammar) cannot run on past its last answer, so it gets HELD_ROOM times that room, HELD_MIN_CODE_TOKENS at
    least for each answer's code: a row cut before its last answer wastes that answer's tokens, and code the copy
    guard turned off a copy runs longer than the copy (docs/yield.md)."""
    code_tokens = sum(len(b.text) for b in safe_blocks(parent_code)) / CHARS_PER_TOKEN
    code_room = (1.5 if edit_format == "full" else 1.0) * code_tokens
    if held:
        code_room = max(HELD_ROOM * code_room, HELD_MIN_CODE_TOKENS)
    per_variant = code_room + VARIANT_OVERHEAD_TOKENS
    return min(ceiling, max(MIN_COMPLETION_TOKENS, int(variants * per_variant)))


def completion_stop(variants: int) -> tuple[str, ...]:
    """The closing tag of the last variant asked for: whatever follows it is never parsed."""
    return (f"</variant {variants}>",)


RUN_MIN = 3  # this many neighbouring components with one value are written as a range


def _vector(scores: Mapping[str, float], limit: int = 24) -> str:
    """`name=value` per component, but a run of neighbours sharing a value as `first…last=value`: a problem scored
    per case (24 cases, mostly 0 or 1) then costs tens of tokens per program shown instead of ~170."""
    items = [(k, f"{v:.4g}") for k, v in list(scores.items())[:limit]]
    shown: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1][1] == items[i][1]:
            j += 1
        if j - i + 1 >= RUN_MIN:
            shown.append(f"{items[i][0]}…{items[j][0]}={items[i][1]}")
        else:
            shown += [f"{k}={v}" for k, v in items[i : j + 1]]
        i = j + 1
    more = len(scores) - limit
    return ", ".join(shown) + (f", … ({more} more)" if more > 0 else "")


def safe_blocks(code: str) -> list[EditableBlock]:
    try:
        return find_blocks(code)
    except BlockError:  # an archive written before bad_blocks existed may hold such a program
        return [EditableBlock(0, 0, len(code), code)]


def _blocks(code: str, tag: str, cap: int | None = None, multi_file: bool = False) -> str:
    if multi_file:  # a program of several files: its blocks under their files' headers
        return program_blocks(code, tag, cap)
    blocks = safe_blocks(code)

    def body(text: str) -> str:
        text = text.rstrip()
        return text if cap is None or len(text) <= cap else text[:cap] + "\n# … (cut)"

    if len(blocks) == 1:
        return f"```{tag}\n{body(blocks[0].text)}\n```"
    return "\n".join(f"Block {b.index + 1}:\n```{tag}\n{body(b.text)}\n```" for b in blocks)


def _instructions(
    m: int, edit_format: str, n_blocks: int, template: str, tag: str, tree: bool = False, lead: str = ""
) -> str:
    """The ask's rules, fixed for a run (the variants, their format and directions); the part that depends on the
    group (its recent children) is in the closing line. `lead`: the comment prefix of the lead line each fenced
    block opens with (`PromptInputs.lead_comment`), said in one sentence where the grammar holds it."""
    tags = " ".join(f"<variant {k}>…</variant {k}>" for k in range(1, m + 1))
    many = "s" if m > 1 else ""
    rules = [
        f"Write {m} new variant{many} of the editable code of the current program shown below, each meant to score "
        "better than it.",
        "Every variant must change the code: a copy of the current code is wasted and scores nothing.",
    ]
    if m > 1:
        rules.append("The variants must differ from each other.")
    if template == "directed":
        rules += [f"Variant {k}: {DIRECTIONS[(k - 1) % len(DIRECTIONS)]}." for k in range(1, m + 1)]
    elif m > 1:
        rules.append("Each variant must try a clearly different idea.")
    rules.append(f"Wrap each one in its tag: {tags}.")
    head = "\n".join(f"- {r}" for r in rules) + "\n"
    if tree:
        head += tree_rules(edit_format, tag)
    if edit_format == "diff":
        return head + (
            "Inside a variant, give one or more edits in exactly this form, where SEARCH copies lines of the "
            "current editable code exactly and REPLACE differs from it:\n<<<<<<< SEARCH\n(lines to find)\n"
            "=======\n(new lines)\n>>>>>>> REPLACE\n"
        )
    lead_rule = (
        f"The first line of each fenced block is a comment, `{lead} Change: ...`, saying in a few words what this "
        "variant changes; the code follows it.\n"
        if lead
        else ""
    )
    if tree:  # the files' rules above say it all: a second, positional rule only confuses a small model
        return head + lead_rule
    fences = f"Inside a variant, give {_fences(n_blocks, tag)} holding the complete new editable code.\n"
    return head + fences + lead_rule


def _fences(n_blocks: int, tag: str) -> str:
    return f"one ```{tag} fenced block" if n_blocks == 1 else f"{n_blocks} ```{tag} fenced blocks, in order"


def _closing(m: int, edit_format: str, n_blocks: int, has_recent: bool, tag: str, tree: bool = False) -> str:
    """The ask again in a sentence or two, after the parent: what to write now, in which tags and form."""
    many = "s" if m > 1 else ""
    form = "SEARCH/REPLACE edits" if edit_format == "diff" else _fences(n_blocks, tag)
    if tree:
        form = "for each file it changes, the file's header line and then its " + (
            "SEARCH/REPLACE edits" if edit_format == "diff" else f"```{tag} fenced blocks"
        )
    lines = [
        f"Now write the {m} variant{many} of the current program, as the task above says: each in its tag "
        f"<variant k>…</variant k>, holding {form}."
    ]
    if has_recent:
        lines.append(
            "The variants must differ from each other and from the recent children above."
            if m > 1
            else "The variant must differ from the recent children above."
        )
    return " ".join(lines)


@dataclass(frozen=True)
class Composed:
    """A group's ask as one record: the prompt, the edit format it asks for (resolved for the parent), its fences'
    tag, and the bounds of an answer (its token budget and stop strings)."""

    text: str
    edit_format: str  # diff | full
    fence: str
    max_new_tokens: int
    stop: tuple[str, ...]


def compose(p: PromptInputs, ceiling: int, fit_tokens: bool = True, held: bool = False) -> Composed:
    """The prompt of `p` and what bounds its answer: `ceiling` tokens (the problem's max_new_tokens), fitted to
    the parent's code when `fit_tokens` (`completion_budget`; `held`: the answer's shape is held by a grammar)."""
    p = replace(p, edit_format=resolve_edit_format(p.edit_format, p.parent_code))  # resolved once, here
    budget = completion_budget(p.parent_code, p.variants, p.edit_format, ceiling, held) if fit_tokens else ceiling
    return Composed(build_prompt(p), p.edit_format, p.fence_tag, budget, completion_stop(p.variants))


def build_prompt(p: PromptInputs) -> str:
    fmt = resolve_edit_format(p.edit_format, p.parent_code)
    n_blocks = len(safe_blocks(p.parent_code))
    tag = p.fence_tag
    tree = p.multi_file
    parts = ["# Problem", p.description.strip()]  # fixed for a run: a prompt cache reuses all of it, to "# Task"
    fixed = fixed_code_view(p.parent_code, p.line_comment) if p.fixed_code and not tree else None
    calls = p.interface if fixed is not None else ()
    if fixed is not None:
        rule = _interface_rule(calls, p.interface_examples)
        parts += [
            "# Fixed code of the program",
            f"It cannot change; it shows how the editable code is used.{rule}\n\n```{tag}\n{fixed}\n```",
        ]
    parts += [
        "# Task",
        _instructions(p.variants, fmt, n_blocks, p.template, tag, tree, p.lead_comment),
    ]
    parts += [  # this group's own: from here on every prompt differs
        "# Current program",
        f"Scores (higher is better unless the problem says otherwise): {_vector(p.parent_scores)}",
        _tree_heading(p.program_view) if tree else "Editable code:",
        current_program(p.parent_code, tag, view=p.program_view) if tree else _blocks(p.parent_code, tag),
    ]
    if p.parent_feedback:
        parts += ["Evaluator feedback:", p.parent_feedback.strip()[:FEEDBACK_CAP]]
    parts += failure_parts(p.parent_stderr, p.parent_case_errors, p.parent_swallowed, p.recent_failures, p.multi_file)
    as_diffs = p.others_view == "diff" and not tree
    for i, (code, scores) in enumerate(((s.code, s.scores) for s in p.inspirations), 1):
        shown = _changes(p.parent_code, code) if as_diffs else None
        heading = f"# Other program {i}" + (" (its changes from the current program)" if shown is not None else "")
        parts += [heading, f"Scores: {_vector(scores)}", _blocks(code, tag, None, tree) if shown is None else shown]
    if p.recent:
        parts.append("# Recent children of the current program (already tried: do not repeat them)")
        for code in p.recent:
            shown = _changes(p.parent_code, code, RECENT_CAP) if as_diffs else None
            parts.append(_blocks(code, tag, RECENT_CAP, tree) if shown is None else shown)
    closing = _closing(p.variants, fmt, n_blocks, bool(p.recent), tag, tree)
    if calls:  # an edit keeps what it does not touch: "define" would invite a second definition
        names = _listed(calls)
        closing += f" Each variant must {f'keep {names} defined' if fmt == 'diff' else f'define {names}'}."
    parts += ["# Your answer", closing]
    return "\n\n".join(parts)


def _listed(calls: Sequence[str]) -> str:
    quoted = [f"`{c}`" for c in calls]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _interface_rule(calls: Sequence[str], examples: Sequence[str] = ()) -> str:
    """The sentence that names what the fixed code calls from the editable code, or "" where it calls nothing;
    then the calls the seed's evaluation made, which show what the arguments are (one job's dict, not the list)."""
    if not calls:
        return ""
    one = len(calls) == 1
    seen = (
        f" Evaluating the seed, it made the call{'' if len(examples) == 1 else 's'} {_listed(examples)}."
        if examples
        else ""
    )
    return (
        f" It calls {_listed(calls)} from the editable code: every variant must define "
        f"{'it, with this name and these parameters' if one else 'them, with these names and parameters'}.{seen} "
        "Write only the editable code, never the fixed code."
    )


def _changes(parent_code: str, code: str, cap: int | None = None) -> str | None:
    """`code`'s editable blocks as a unified diff against the parent's, in a ```diff fence; None (show it whole)
    when the two have different blocks (a program whose markers broke) or a block too long for a quick diff."""
    try:
        ours, theirs = find_blocks(parent_code), find_blocks(code)
    except BlockError:
        return None
    if len(ours) != len(theirs):
        return None
    pairs = [
        (mine.text.rstrip().splitlines(), other.text.rstrip().splitlines())
        for mine, other in zip(ours, theirs, strict=True)
    ]
    if any(max(len(a), len(b)) > DIFF_MAX_LINES for a, b in pairs):
        return None
    hunks = []
    for k, (mine, other) in enumerate(pairs):
        body = "\n".join(list(difflib.unified_diff(mine, other, lineterm="", n=DIFF_CONTEXT))[2:])  # no file headers
        if body:
            body = body if cap is None or len(body) <= cap else body[:cap] + "\n… (cut)"
            hunks.append((f"Block {k + 1}:\n" if len(ours) > 1 else "") + f"```diff\n{body}\n```")
    return "\n".join(hunks) or "(the same editable code as the current program)"


def _tree_heading(view: str) -> str:
    if view == "blocks":
        return "Its files (only their EVOLVE blocks are shown, and only these may change):"
    return "Its files (change only what lies between the EVOLVE-BLOCK markers):"
