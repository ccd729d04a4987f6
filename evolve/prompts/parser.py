"""Completion → child programs. Tolerant of what small models write, strict about what may change.

Per variant: SEARCH/REPLACE edits (exact match first, then a match that ignores indentation and trailing
whitespace, re-indenting the replacement), or fenced code that rewrites the editable blocks. An edit that
touches code outside the EVOLVE blocks is rejected, and so is a result whose block structure differs from the
parent's (a marker added, removed, nested or moved): `bad_blocks`. Such a program would break every later
prompt built from it. Every variant comes back with a status, never an exception.

Model output is hostile text (8 KB of spaces and tabs once held a run's core for 35 minutes), so every rule reads
it in linear time, and the whole parse is bounded (evolve/prompts/parse_limits.py: a size cap and a deadline).
The edits are found by scanning for their markers (evolve/prompts/edit_scan.py). The patterns below stay regexes
because each is linear as written: no two of its quantifiers can take the same run of characters (so a failed
attempt gives a run back once, not once per way of splitting it), a lazy body (`_TAG`'s, a fence's) tries its
end only where a `<` or a backtick stands, reading just the whitespace and word after it, and the line patterns
start only at line starts. tests/test_parser_hostile.py times each on 64 KB of hostile text. An engine with a
guarantee (RE2) was not needed for that, lacks the lookaheads `_TAG` uses, and is a compiled dependency.

Whether the parent is a program of several files (whose variants name the file they change) is the problem's to
say (`multi_file`, from `[program] files`), never the parent's text: on a problem of one file, a parent that
starts with a `=== FILE: ` line (a model can write one; a shell problem runs it) is one text like any other, so
its children may drop those lines or change what follows them.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass

from evolve.problem.blocks import START, BlockError, find_blocks, frame_changes, replace_blocks
from evolve.prompts.block_match import functions, match_blocks
from evolve.prompts.edit_scan import find_edits
from evolve.prompts.parse_limits import PARSE_SECONDS, UNLIMITED, Deadline, ParseTimeout, oversize

_TAG = re.compile(r"<\s*variant\s*(\d+)\s*>(.*?)(?=<\s*/\s*variant\s*\d*\s*>|<\s*variant\s*\d+\s*>|\Z)", re.S | re.I)
# Each optional decoration takes the spaces after it. Written as three runs of spaces around an optional `#` and
# `*`, a line of n spaces was tried in every way of cutting it in three (n cubed: 1,000 spaces 1.8 s, 3,000 47 s).
_HEADING = re.compile(r"^[ \t]*(?:(?:#{1,6}|//)[ \t]*)?(?:\*+[ \t]*)?variant[ \t]*(\d+)\b[^\n]*$", re.M | re.I)
_FENCE_LINE = re.compile(r"^[ \t]*```[^\n]*$", re.M)
_FENCE = re.compile(r"```(?:[ \t]*(?:python|py))?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)
# Another language's fence (```c, ```rust). Neither pattern lets two quantifiers share a run of spaces: a fence
# opener followed by 20,000 spaces took 0.8 s.
_ANY_FENCE = re.compile(r"```(?:[ \t]*[\w+#.-]+)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)
# The lead comment a `full` answer's fenced blocks open with where its shape asks for one (`# Change: ...`, `//` in
# C and its kin: policies/answer_grammar.py). It says what the variant changes, not what the program does, so it is
# dropped: the parent written back under a new lead is then `unchanged` in every language (a program in another
# language than Python is hashed as written, comments and all, and would have looked new), and a child's lead
# does not stay on in its own children's code. Another comment line after it is code like any other: in Python the
# hash drops it (a copy is a duplicate), elsewhere it makes a copy look new. The two runs of blanks are parted by
# the prefix, so a failed match gives each back once; it starts only at line starts, as the other line patterns.
_LEAD = re.compile(r"^[ \t]*(?:#|//)[ \t]*Change:[^\n]*(?:\n|\Z)", re.M)


@dataclass(frozen=True)
class ParsedVariant:
    slot: int
    status: str  # ok | parse_error | apply_error | outside_block | bad_blocks | syntax_error | unchanged
    code: str | None
    detail: str | None = None


def split_variants(text: str, m: int) -> list[str]:
    """Bodies of <variant k> sections in order. Untagged text split by numbered headings ("### Variant 2",
    "# Variant 2: ...", "**Variant 2**") when it has at least two of them, else a single variant."""
    found = [(int(k), body) for k, body in _TAG.findall(text)]
    if not found:
        found = _headed_sections(text)
    if not found:
        return [text] if text.strip() else []
    bodies: dict[int, str] = {}
    for k, body in found:
        bodies.setdefault(k, body)
    return [bodies[k] for k in sorted(bodies)][:m]


def _headed_sections(text: str) -> list[tuple[int, str]]:
    heads = list(_HEADING.finditer(text))
    if len({h.group(1) for h in heads}) < 2:
        return []
    ends = [h.start() for h in heads[1:]] + [len(text)]
    sections = []
    fences, counted = 0, 0  # fence lines before the heading, counted once over the text (not from 0 each time)
    for head, end in zip(heads, ends, strict=True):
        fences += len(_FENCE_LINE.findall(text, counted, head.start()))
        counted = head.start()
        body = text[head.end() : end]
        if fences % 2:  # a heading comment inside a fenced block
            body = "```python\n" + body
        sections.append((int(head.group(1)), body))
    return sections


def _strip_fences(s: str) -> str:
    lines = s.split("\n")
    return "\n".join(line for line in lines if not line.strip().startswith("```"))


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _fuzzy_find(code: str, search: str) -> tuple[int, int, str, str] | None:
    """Match `search` line by line ignoring indentation; returns (start, end, found_indent, search_indent).

    The first run of lines whose stripped texts equal the search's is found by one `str.find` over the stripped
    lines joined by newlines (no stripped line holds one, so a hit starts and ends on line boundaries): linear,
    where comparing at every line was the code's lines times the search's (a hostile search of thousands of
    lines that almost match)."""
    want = search.split("\n")
    while want and not want[-1].strip():
        want.pop()
    while want and not want[0].strip():
        want.pop(0)
    if not want:
        return None
    lines = code.split("\n")
    stripped = "\n" + "\n".join(ln.strip() for ln in lines) + "\n"
    at = stripped.find("\n" + "\n".join(ln.strip() for ln in want) + "\n")
    if at < 0:
        return None
    i = stripped.count("\n", 0, at)  # the hit's first line
    offsets = [0]
    for ln in lines:
        offsets.append(offsets[-1] + len(ln) + 1)
    end = offsets[i + len(want)] - 1
    return offsets[i], end, _indent(lines[i]), _indent(want[0])


def _reindent(text: str, old: str, new: str) -> str:
    if old == new:
        return text
    out = []
    for ln in text.split("\n"):
        out.append(new + ln[len(old) :] if ln.startswith(old) else (new + ln.lstrip() if ln.strip() else ln))
    return "\n".join(out)


def _apply_edits(
    code: str, edits: list[tuple[str, str]], deadline: Deadline = UNLIMITED
) -> tuple[str | None, str, str | None]:
    for search, replace in edits:
        deadline.check()  # each edit costs the code's length: thousands of them are checked one by one
        search, replace = _strip_fences(search), _strip_fences(replace)
        if not search.strip():
            return None, "apply_error", "empty SEARCH section"
        start = code.find(search)
        if start >= 0:
            end = start + len(search)
        else:
            hit = _fuzzy_find(code, search)
            if hit is None:
                return None, "apply_error", f"SEARCH text not found: {search.strip()[:80]!r}"
            start, end, found_indent, search_indent = hit
            replace = _reindent(replace.strip("\n"), search_indent, found_indent)
        if not any(b.start <= start and end <= b.end for b in find_blocks(code)):
            return None, "outside_block", "an edit touches code outside the EVOLVE blocks"
        code = code[:start] + replace + code[end:]
    return code, "ok", None


def _bare_code(body: str, python: bool) -> str | None:
    """Small models often skip the fence inside a variant tag: accept a body that is Python by itself (for a
    program in another language, any body of several lines: its build judges it)."""
    body = _FENCE_LINE.split(body.strip("\n"), maxsplit=1)[0]  # a stray closing fence and any prose after it
    code = textwrap.dedent(body.strip("\n"))
    if not code.strip() or "\n" not in code.strip():
        return None
    if not python:
        return code
    try:
        ast.parse(code)
    except SyntaxError:
        return None
    return code


def _without_lead(code: str) -> str:
    """A fenced block's code without its lead comment line (`_LEAD`), where it opens with one."""
    lead = _LEAD.match(code)
    return code if lead is None else code[lead.end() :]


def _full_rewrite(parent: str, body: str, deadline: Deadline = UNLIMITED) -> tuple[str | None, str, str | None]:
    python = is_python(parent)
    fence = _FENCE if python else _ANY_FENCE  # a Python answer's ```bash aside is not its code
    fences = [f for f in map(_without_lead, fence.findall(body)) if f.strip()]
    blocks = [b.text for b in find_blocks(parent)]
    python_blocks = len(blocks) > 1 and all(map(is_python, blocks))  # pieces are then placed statement by statement
    deadline.check()
    if not fences:
        bare = _bare_code(body, python)
        if bare is None or (len(blocks) != 1 and match_blocks(blocks, [bare], python_blocks, deadline) is None):
            return None, "parse_error", "no SEARCH/REPLACE edit and no fenced code"
        fences = [bare]
    if len(fences) == 1 and START in fences[0]:
        try:  # the model echoed the whole file: take what lies between its markers
            fences = [b.text for b in find_blocks(fences[0])]
        except BlockError as exc:
            return None, "parse_error", str(exc)
    if len(blocks) > 1:  # blocks known by the names they define: some left out, merged or reordered
        matched = match_blocks(blocks, fences, python_blocks, deadline)
        if matched is not None:
            return replace_blocks(parent, matched), "ok", None
    if len(fences) < len(blocks):
        return None, "parse_error", f"{len(fences)} code blocks for {len(blocks)} editable blocks"
    return replace_blocks(parent, [f.rstrip("\n") + "\n" for f in fences[: len(blocks)]]), "ok", None


def parse_variant(
    parent: str, body: str, slot: int, deadline: Deadline = UNLIMITED, *, multi_file: bool = False
) -> ParsedVariant:
    """One variant's status and code; any surprise inside the parser costs this variant, never the caller (the
    deadline's `ParseTimeout` and `ParseInterrupted` excepted: they end the whole completion's parse).
    `multi_file`: the parent is a program of several files (its problem's `[program] files`)."""
    try:
        if multi_file:  # edits name their file (evolve/prompts/tree_edits.py)
            return _parse_tree_variant(parent, body, slot, deadline)
        return _parse_variant(parent, body, slot, deadline)
    except (BlockError, ValueError, RecursionError, MemoryError) as exc:
        return ParsedVariant(slot, "parse_error", None, f"{type(exc).__name__}: {str(exc)[:200]}")


def _parse_variant(parent: str, body: str, slot: int, deadline: Deadline) -> ParsedVariant:
    edits = find_edits(body)
    deadline.check()
    code, status, detail = _apply_edits(parent, edits, deadline) if edits else _full_rewrite(parent, body, deadline)
    if code is None:
        return ParsedVariant(slot, status, None, detail)
    deadline.check()
    code, renamed = _restore_renamed_function(parent, code)
    if code == parent:
        return ParsedVariant(slot, "unchanged", None, "the variant changes nothing")
    broken = frame_changes(parent, code)
    if broken is not None:
        return ParsedVariant(slot, "bad_blocks", None, broken)
    if is_python(parent):  # a program in another language is checked by its own build, in the sandbox
        try:
            ast.parse(code)
        except SyntaxError as exc:
            return ParsedVariant(slot, "syntax_error", None, f"line {exc.lineno}: {exc.msg}")
    return ParsedVariant(slot, "ok", code, renamed)


def _parse_tree_variant(parent: str, body: str, slot: int, deadline: Deadline) -> ParsedVariant:
    from evolve.prompts.tree_edits import edit_tree, tree_changes, tree_syntax_error

    code, status, detail = edit_tree(parent, body, deadline)
    if code is None:
        return ParsedVariant(slot, status, None, detail)
    deadline.check()
    if code == parent:
        return ParsedVariant(slot, "unchanged", None, "the variant changes nothing")
    broken = frame_changes(parent, code) or tree_changes(parent, code)
    if broken is not None:
        return ParsedVariant(slot, "bad_blocks", None, broken)
    error = tree_syntax_error(code)  # .py files only: others are judged by their build
    if error is not None:
        return ParsedVariant(slot, "syntax_error", None, error)
    return ParsedVariant(slot, "ok", code)


def is_python(code: str) -> bool:
    """True when `code` parses as Python. A program in any other language (C, Rust) does not: its children skip
    the Python syntax check, and the prompt shows its code in untagged fences."""
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def _restore_renamed_function(parent: str, code: str) -> tuple[str, str | None]:
    """Small models rename the function they rewrite (`solve` becomes `parse_duration`), and the evaluator then
    finds no entry point. When exactly one top-level function of the parent is gone and exactly one new one
    appeared, the new name is put back inside the editable blocks (outside code is never touched)."""
    before = {name for name, _ in functions(parent)}  # none when it does not parse
    after = {name for name, _ in functions(code)}
    gone, new = before - after, after - before
    if len(gone) != 1 or len(new) != 1:
        return code, None
    (old_name,), (new_name,) = gone, new
    word = re.compile(rf"\b{re.escape(new_name)}\b")
    try:  # a child whose markers broke is left as it is: the block check names that (`bad_blocks`)
        renamed = replace_blocks(code, [word.sub(old_name, b.text) for b in find_blocks(code)])
    except BlockError:
        return code, None
    return renamed, f"renamed {new_name} back to {old_name}"


def parse_completion(
    parent: str,
    text: str,
    m: int,
    *,
    multi_file: bool = False,
    stop: Callable[[], bool] | None = None,
    seconds: float | None = None,
) -> list[ParsedVariant]:
    """Always m entries: missing variants come back as parse errors. A completion larger than
    MAX_COMPLETION_CHARS, or one that takes longer than `seconds` of CPU time to parse (PARSE_SECONDS unless
    given), is not read: every entry is a parse error that says why. `stop` (the run's interrupt flag) is asked
    at every check of the deadline; when it says yes, `ParseInterrupted` is raised (the caller drops the group).
    `multi_file`: the parent's problem is one of several files (`Problem.multi_file`); else, whatever the parent's
    text holds, it is one file."""
    too_large = oversize(text)
    if too_large is not None:
        return _unread(m, too_large)
    deadline = Deadline(PARSE_SECONDS if seconds is None else seconds, stop)
    try:
        deadline.check()
        bodies = split_variants(text, m)
        out = []
        for k, body in enumerate(bodies):
            deadline.check()
            out.append(parse_variant(parent, body, k, deadline, multi_file=multi_file))
        deadline.check()  # the last variant's checks (its syntax above all) ran past the limit: the same rule
    except ParseTimeout as exc:
        return _unread(m, str(exc))
    out += [ParsedVariant(k, "parse_error", None, "variant missing") for k in range(len(out), m)]
    return out


def _unread(m: int, why: str) -> list[ParsedVariant]:
    return [ParsedVariant(k, "parse_error", None, why) for k in range(m)]
