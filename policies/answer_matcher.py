"""The answer's language (policies/answer_grammar.py) as a character-level matcher in pure Python.

Why: llama.cpp's grammar engine judges the token ids of a llama vocab (a GGUF's); a backend that has only a
tokenizer and logits (transformers) has none to give it. The language is small and made of lines: a tag line,
then fence lines, code lines, edit markers, a closing tag. So a state is where the answer stands (which
variant, which part of it) and the current line so far, and a line is judged when it ends or as soon as its
start settles it. A code line that starts with none of the refused prefixes (`CODE_LINE_NEVER`,
`EDIT_MARKERS`) nor with an edit's or fence's marker is free to its newline, so most characters cost one
`str.find`.

It takes exactly the strings `answer_gbnf(shape)` takes, prefix by prefix (tests/test_answer_matcher.py drives
both over generated answers and near-misses): a line is either a whole literal (a tag, a fence's opening, an
edit's SEARCH), a marker after optional indentation (a fence's close, an edit's divider and close), a line that
begins with a given start and goes on without `COMMENT_NEVER`'s characters (a lead comment, `# Change: ...`, and
the comment line that may follow it, judged to their newline), or a code line where the part allows code (after a
lead comment: one that holds code, `_Rules.real`). A code line settled free leads to the part code leads to, so
a state free to its newline already names the part after it. `advance` takes any text, so a token spanning
several lines and tags is judged as the text it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from policies.answer_grammar import (
    CODE_LINE_NEVER,
    COMMENT_NEVER,
    EDIT_MARKERS,
    INDENT,
    AnswerShape,
    file_header,
    lead_text,
)

REFUSED_STARTS = CODE_LINE_NEVER + EDIT_MARKERS  # what no code line begins with after its indentation
SEARCH, DIVIDER, REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"

# The parts of an answer: the line each expects next. Every part is of one variant (`MatchState.variant`).
TAG = "tag"  # its opening tag (the first variant, or after the blank line between two)
GAP = "gap"  # after the previous variant's closing tag and newline: a blank line or the opening tag
OPEN = "open"  # after the opening tag (or a file's header): a fence's opening (or, under `diff`, an edit's SEARCH)
HEAD = "head"  # after the opening tag, in a program of several files: a file's header
FENCE = "fence"  # inside a fenced block: code, or the fence's close
LEAD, COMMENTED = "lead", "commented"  # after a `full` fence's opening: its lead comment; then code, or a comment
FIRST_CODE = "first_code"  # after the lead comment and the one comment line that may follow it: a line of code
AFTER_FENCE = "after_fence"  # another fenced block, or the closing tag
SEARCH_PART, REPLACE_PART = "search", "replace"  # inside an edit, before and after its divider
AFTER_EDIT = "after_edit"  # another edit, or the closing tag


@dataclass(frozen=True, slots=True)
class MatchState:
    """Where an answer stands: the part it is in, of which variant (1-based), and its current line so far
    (None once the line is free to its end: the part is then the one after its newline)."""

    part: str
    variant: int
    line: str | None = ""


@dataclass(frozen=True)
class _Rules:
    """The lines a part takes: whole `literals`, indented `markers` and lines that go on from one of `starts` by
    a character or more, each to the part it leads to; `code` lines, to the part they lead to, where code may
    stand (None: none), which must hold code where `real` (not blank, nor starting with `real` after their
    indentation); `final`, the line that ends the answer where it stands (`</variant m>`)."""

    literals: dict[str, tuple[str, int]]
    markers: dict[str, tuple[str, int]] = field(default_factory=dict)
    code: tuple[str, int] | None = None
    final: str = ""
    starts: dict[str, tuple[str, int]] = field(default_factory=dict)
    real: str = ""


def _code_ok(content: str, real: str = "") -> bool:
    """Whether a line whose text after its indentation is `content` (so far) is still a code line."""
    return not content.startswith(REFUSED_STARTS) and not (real and content.startswith(real))


class AnswerMatcher:
    """The language of one `AnswerShape`; states are values (`MatchState`), so rows and candidates share it."""

    def __init__(self, shape: AnswerShape) -> None:
        self.shape = shape
        self.fence_open = f"```{shape.language}"
        self.fence_code = LEAD if shape.lead_comment else FENCE  # the part after a fence's opening
        self._rules: dict[tuple[str, int], _Rules] = {}
        self.opened = HEAD if shape.files else OPEN  # the part after an opening tag
        self.headers = [file_header(path) for path in shape.files]

    def start(self) -> MatchState:
        return MatchState(TAG, 1)

    def complete(self, state: MatchState) -> bool:
        """Whether the answer ends here: after `</variant m>`, where only an end of turn may follow."""
        final = self.rules(state.part, state.variant).final
        return bool(final) and state.line == final

    def advance(self, state: MatchState, text: str) -> MatchState | None:
        """The state after `text`, or None when the language refuses it (at any of its characters)."""
        part, variant, line = state.part, state.variant, state.line
        rules = self.rules(part, variant)
        at, end = 0, len(text)
        while at < end:
            if line is None:  # a free code line: to its newline, whatever it holds
                newline = text.find("\n", at)
                if newline < 0:
                    break
                at, line = newline + 1, ""
                continue
            char = text[at]
            at += 1
            if char == "\n":
                after = self._line_end(rules, line)
                if after is None:
                    return None
                part, variant = after
                rules, line = self.rules(part, variant), ""
                continue
            line += char
            settled = self._settles(rules, line)
            if settled is False:
                return None
            if settled is not None:
                line = None
                if settled != (part, variant):
                    part, variant = settled
                    rules = self.rules(part, variant)
        return MatchState(part, variant, line)

    def rules(self, part: str, variant: int) -> _Rules:
        key = (part, variant)
        rules = self._rules.get(key)
        if rules is None:
            rules = self._rules[key] = self._make_rules(part, variant)
        return rules

    def _make_rules(self, part: str, k: int) -> _Rules:
        tag, diff = f"<variant {k}>", self.shape.edit_format == "diff"
        close: dict[str, tuple[str, int]] = {}
        final = ""
        if part in (AFTER_FENCE, AFTER_EDIT):
            if k < self.shape.variants:
                close = {f"</variant {k}>": (GAP, k + 1)}
            else:
                final = f"</variant {k}>"
            close |= {header: (OPEN, k) for header in self.headers}  # the next file's section
        if part == TAG:
            return _Rules({tag: (self.opened, k)})
        if part == GAP:
            return _Rules({"": (TAG, k), tag: (self.opened, k)})
        if part == HEAD:
            return _Rules({header: (OPEN, k) for header in self.headers})
        if part == OPEN:
            return _Rules({self.fence_open: (self.fence_code, k), **({SEARCH: (SEARCH_PART, k)} if diff else {})})
        if part == FENCE:
            return _Rules({}, {"```": (AFTER_FENCE, k)}, code=(FENCE, k))
        if part == AFTER_FENCE:
            return _Rules({self.fence_open: (self.fence_code, k), **close}, final=final)
        if part in (LEAD, COMMENTED, FIRST_CODE):
            return self._lead_rules(part, k)
        if part == SEARCH_PART:
            return _Rules({}, {DIVIDER: (REPLACE_PART, k)}, code=(SEARCH_PART, k))
        if part == REPLACE_PART:
            return _Rules({}, {REPLACE: (AFTER_EDIT, k)}, code=(REPLACE_PART, k))
        if part == AFTER_EDIT:
            return _Rules({SEARCH: (SEARCH_PART, k), **close}, final=final)
        raise ValueError(f"no part {part!r} in an answer")

    def _lead_rules(self, part: str, k: int) -> _Rules:
        """A `full` block's opening lines: the lead comment (`# Change: ` and a character or more), then one
        comment line at column 0 or a line of code, then (after the comment) a line of code; then the block's
        code (`FENCE`)."""
        prefix = self.shape.lead_comment
        if part == LEAD:
            return _Rules({}, starts={lead_text(prefix): (COMMENTED, k)})
        comment = {prefix: (FIRST_CODE, k)} if part == COMMENTED else {}
        return _Rules(comment, code=(FENCE, k), starts=comment, real=prefix[0])

    @staticmethod
    def _line_end(rules: _Rules, line: str) -> tuple[str, int] | None:
        """The part after `line` and its newline, or None when no line of this part is `line`."""
        if line in rules.literals:
            return rules.literals[line]
        for start, after in rules.starts.items():
            if len(line) > len(start) and line.startswith(start):
                return after
        content = line.lstrip(INDENT)
        if content in rules.markers:
            return rules.markers[content]
        if rules.code is None or not _code_ok(content, rules.real) or (rules.real and not content):
            return None
        return rules.code

    @staticmethod
    def _settles(rules: _Rules, line: str) -> tuple[str, int] | Literal[False] | None:
        """Whether the line so far (not yet ended) is refused (False), is free to its end (the part it leads to),
        or may still become one of the part's literals, starts or markers, or be refused (None)."""
        if rules.final.startswith(line) or any(literal.startswith(line) for literal in rules.literals):
            return None
        for start in rules.starts:
            if start.startswith(line):
                return None
            if line.startswith(start):  # judged to its newline: its text may not hold COMMENT_NEVER's characters
                return False if line[-1] in COMMENT_NEVER else None  # the characters before it were judged so
        content = line.lstrip(INDENT)
        if any(marker.startswith(content) for marker in rules.markers):
            return None
        if rules.code is None or not _code_ok(content, rules.real):
            return False
        return rules.code if all(not refused.startswith(content) for refused in REFUSED_STARTS) else None
