"""The code around a one-file program's EVOLVE blocks, shown once in its prompt so the model sees how its
editable code is called.

Why: a prompt that shows only the editable code leaves a small model to guess the interface. On bin_packing
(issue 37) the embedded 0.5B model made `priority(item, remaining)` return one bin's index, `[min_index]`, where
the fixed `solve` indexes the returned scores once per open bin: 29 of 40 evaluations crashed with an IndexError
or a TypeError (shown the fixed code, IndexErrors went from 29 of 45 to 2 of 47: docs/yield.md). The fixed code is
the same for every program of a run (an edit outside the blocks is rejected), so it belongs to the prompt's fixed
head, which a prompt cache reuses, and it goes before the current program: a small model rewrites the last code it
read (evolve/prompts/tree_view.py).

It also names the blocks' functions that the fixed code calls (`interface_calls`), with their parameters as the
block defines them: on job_priority, 132 of 474 children evaluated (28%) rewrote the fixed `schedule` instead of
`priority(job)` and crashed on a NameError (docs/yield.md). A prompt line can say what every variant must define.

Too long to show whole, it shrinks to the lines around each call of a name it does not define itself (the blocks'
functions among them) and around the blocks' places, then to a cut.
"""

from __future__ import annotations

import builtins
import re
import sys

from evolve.problem.blocks import BlockError, find_blocks, has_markers

PLACE = "[the editable code"  # opens the comment line that stands for a block
FIXED_CODE_CHARS = 3000  # about 1,000 tokens of the prompt's cached head, at most
AROUND_USE = 3  # lines kept either side of a line that calls a name the fixed code does not define
CALLED = re.compile(r"\b([A-Za-z_]\w*)[^\S\n]*\(")  # a name called, within one line
# A function or type the fixed code defines itself (Python, Rust); one line at a time, so linear in the code
DEFINES = re.compile(r"^[^\S\n]*(?:async[^\S\n]+)?(?:def|class|fn|struct|enum)[^\S\n]+(\w+)", re.MULTILINE)
# A function a block defines at its top level (a method or a nested function is not what the fixed code calls by
# its bare name; a type's "parameters" would be its bases or fields)
TOP_FUNCTION = re.compile(r"^(?:pub(?:\([\w ]+\))?[^\S\n]+)?(?:async[^\S\n]+)?(?:def|fn)[^\S\n]+(\w+)", re.MULTILINE)
# A call of a bare name: not a method or a path's member (`xs.sort()`, `Vec::new()`)
PLAIN_CALL = re.compile(r"(?<![\w.:])([A-Za-z_]\w*)[^\S\n]*\(")
# What may stand between a function's name and its parameter list: spaces, and a Rust function's generics
BEFORE_PARAMETERS = re.compile(r"[^\S\n]*(?:<[\w\s,:'&<>]*>)?[^\S\n]*")
# Called like functions, defined by no program: the words of control flow and Python's builtins
NOT_DEFINED = frozenset(dir(builtins)) | {
    "if",
    "for",
    "while",
    "switch",
    "return",
    "sizeof",
    "elif",
    "not",
    "and",
    "or",
}


def fixed_code_view(code: str, comment: str = "#", budget: int = FIXED_CODE_CHARS) -> str | None:
    """The program with each EVOLVE block (marker lines included) replaced by one line in its language's line
    `comment`, within `budget` characters; None where the program has no markers (all of it is editable) or nothing
    around its blocks."""
    if not has_markers(code):
        return None
    try:
        blocks = find_blocks(code)
    except BlockError:
        return None
    lines: list[str] = []
    taken = 0
    for block in blocks:
        opening = code.rfind("\n", 0, max(block.start - 1, 0)) + 1  # the START marker's line
        lines += code[taken:opening].splitlines()
        lines.append(f'{comment} {PLACE}, block {block.index + 1}: shown under "Current program"]')
        closing = code.find("\n", block.end)  # the END marker's line ends here
        taken = len(code) if closing < 0 else closing + 1
    lines += code[taken:].splitlines()
    lines = _squeezed(lines)
    if not any(line.strip() and PLACE not in line for line in lines):
        return None
    text = "\n".join(lines)
    if len(text) > budget:
        text = _around_uses(lines, _called_from_outside(text), comment, budget)
    return text


def interface_calls(code: str) -> list[str]:
    """The functions of the program's EVOLVE blocks that its fixed code calls, each as its name and parameter list
    read from the block's definition line (`priority(job)`), in the order the blocks define them; [] where the
    program has no fixed code or a definition line is not one this reads (a name with no parameter list found).
    Read it from the problem's seed, once a run: a child's drifted signature is not the interface."""
    fixed = fixed_code_view(code, budget=sys.maxsize)  # whole: a cut view could lose the calls
    if fixed is None:
        return []
    called = {m.group(1) for m in PLAIN_CALL.finditer(_without_comments(fixed))} - set(DEFINES.findall(fixed))
    inside = "\n".join(code[b.start : b.end] for b in find_blocks(code))  # fixed_code_view parsed them already
    shown: list[str] = []
    for match in TOP_FUNCTION.finditer(inside):
        name = match.group(1)
        params = _parameters(inside, match.end())
        if name in called and params is not None and f"{name}{params}" not in shown:
            shown.append(f"{name}{params}")
    return shown


def interface_names(code: str) -> list[str]:
    """The bare names of `interface_calls` (`priority`): the functions whose first call the seed's evaluation
    records (sandboxes/first_calls.py)."""
    return [call.split("(", 1)[0] for call in interface_calls(code)]


def _without_comments(code: str) -> str:
    """Each line up to its first `#` or `//` (a comment names functions it does not call; a string cut short only
    drops calls, never adds one)."""
    return "\n".join(re.split(r"#|//", line, maxsplit=1)[0] for line in code.splitlines())


def _parameters(text: str, at: int, cap: int = 200) -> str | None:
    """The parenthesised parameter list that opens right after `at` (spaces and generics allowed before it), with
    its nested parentheses, whitespace runs squeezed; None where there is none within `cap` characters."""
    opening = text.find("(", at, at + cap)
    if opening < 0 or not BEFORE_PARAMETERS.fullmatch(text, at, opening):
        return None
    depth = 0
    for i in range(opening, min(len(text), opening + cap)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            squeezed = " ".join(text[opening : i + 1].split()).replace("( ", "(").replace(" )", ")")
            return re.sub(r",\s*\)$", ")", squeezed)  # a trailing comma is layout
    return None


def _squeezed(lines: list[str]) -> list[str]:
    """No blank lines at either end, and no more than one blank line in a row."""
    kept: list[str] = []
    for line in lines:
        if not line.strip() and (not kept or not kept[-1].strip()):
            continue
        kept.append(line.rstrip())
    while kept and not kept[-1].strip():
        kept.pop()
    return kept


def _called_from_outside(fixed: str) -> set[str]:
    """Names the fixed code calls but does not define: the blocks' functions among them. Read from the fixed code
    alone, so the shrunk view is the same for every program of a run (the prompt cache keeps it)."""
    return {m.group(1) for m in CALLED.finditer(fixed)} - set(DEFINES.findall(fixed)) - NOT_DEFINED


def _around_uses(lines: list[str], names: set[str], comment: str, budget: int) -> str:
    """The lines within AROUND_USE of a line that names one of `names` and of the placeholder lines, the gaps
    marked; cut at `budget` characters."""
    uses = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(names))) + r")\b") if names else None
    keep = [False] * len(lines)
    for i, line in enumerate(lines):
        if (uses is not None and uses.search(line)) or PLACE in line:
            for j in range(max(0, i - AROUND_USE), min(len(lines), i + AROUND_USE + 1)):
                keep[j] = True
    shown: list[str] = []
    for i, line in enumerate(lines):
        if keep[i]:
            shown.append(line)
        elif not shown or shown[-1] != f"{comment} ...":
            shown.append(f"{comment} ...")
    text = "\n".join(shown)
    return text if len(text) <= budget else text[:budget].rsplit("\n", 1)[0] + f"\n{comment} ... (cut)"
