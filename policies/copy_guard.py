"""The copy guard: a variant that is writing again, token for token, code its group already knows is turned off
that path at the first point of code where the model itself doubts it (issue 37, "fewer copies").

Why: under the answer's grammar the embedded model writes code at once, and most of that code is a copy. In the
study's untrained archives (benchmarks/copies.py) 42% of duplicates repeat a child the parent already had (mostly
one not shown in the prompt), 20% a sibling of the same group, 27% a program the prompt showed; 38% of completions
copy in all three slots, and after two copies the third is one 83% of the time. A copy costs every token of a whole
rewrite and gives the search nothing; the copy is not chosen at one point but token by token, each one likely.

How: the code the row is writing (inside its fenced block) is compared with each known code (the parent, the
programs the prompt shows, the parent's 16 newest children, and every block a row of this group has finished),
both without whitespace, import lines and comment-only lines (`comparable`). While it is a prefix of some of them,
each token either continues one (copying), leaves them all (leaving), or neither: whitespace alone, a comment or
the start of one, an import keyword (no change to what runs). At a point of code inside a body of every code it
copies (not a string, a comment, a signature or an import), if the model gives the leaving tokens its grammar
allows at least `DOUBT` of its mass, at its sampling temperature and over its `CANDIDATES` likeliest tokens, only
leaving tokens may come next (`turn`): the row takes the model's own next choices there. Judged inside the nucleus
instead (top-p 0.95), the doubt almost never reached 1%: along a copy of circle_packing's seed the leaving mass was
3.7-8% at the body's first statement and at most about 2% after it. Where the model is sure, nothing changes, and a
copy it never doubts is still written (and caught as a duplicate, unevaluated).

The training signal stays exact: the guard's mask is one more `allowed` composed with the grammar's (`both`), so
each token is drawn from the held distribution and its logprob is that distribution's, as under the grammar alone.
"""

from __future__ import annotations

import io
import re
import tokenize
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from policies.answer_grammar import LINE_COMMENTS
from policies.policy import SamplingParams

CANDIDATES = 64  # the likeliest tokens the doubt is judged on (the rest of the mass is spread thin)
DOUBT = 0.02  # the leaving mass, at the sampling temperature, at which a copy is turned (see the docstring)
FENCE = "```"
_SPACE = re.compile(r"\s+")
# Comments and strings of the C family and most others (a Python code is lexed by `tokenize`).
_C_NOT_CODE = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)
# An import line, in Python, the C family (`#include`), Rust, Go, Java and their kin.
_IMPORT = re.compile(r"[^\S\n]*(?:import\s|from\s+\S+\s+import\s|#\s*include\b|use\s|using\s)")
# What a token that opens an import line starts with, by the fence language's line comment (Python's, or the others)
IMPORT_WORDS = {"#": ("import", "from")}
OTHER_IMPORT_WORDS = ("#include", "using", "use", "import")
_PY_NOT_CODE = re.compile(r"#[^\n]*|\"\"\".*?\"\"\"|'''.*?'''|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)


def squeeze(text: str) -> str:
    return _SPACE.sub("", text)


UNREAD_PREFIX = 256  # a line is judged an import or a comment by its first characters only (see `_unread`)


def _unread(line: str, comment: str) -> bool:
    """A line the guard does not compare: an import (one added or moved changes nothing that runs) or a line that
    is only a comment (a lead comment `# Change: ...` above a copy, or a note added to one). Judged on the line's
    first `UNREAD_PREFIX` characters, so that a row's unfinished line costs the same to judge at every token however
    long it grows (a model that writes one line of 10,000 tokens)."""
    head = line[:UNREAD_PREFIX]
    return bool(_IMPORT.match(head)) or bool(comment and head.lstrip().startswith(comment))


def comparable(text: str, comment: str) -> str:
    """`text` as the guard compares it: its import and comment-only lines dropped, then its whitespace."""
    return squeeze("".join(line for line in text.splitlines(keepends=True) if not _unread(line, comment)))


def _not_code_spans(text: str, comment: str) -> list[tuple[int, int]]:
    """Character spans of `text` inside a comment or a string literal."""
    if comment != "#":
        return [m.span() for m in _C_NOT_CODE.finditer(text)]
    starts = [0]
    for line in io.StringIO(text).readlines():  # lines as tokenize counts them (a form feed ends none)
        starts.append(starts[-1] + len(line))
    try:
        return [
            (starts[t.start[0] - 1] + t.start[1], starts[t.end[0] - 1] + t.end[1])
            for t in tokenize.generate_tokens(io.StringIO(text).readline)
            if t.type in (tokenize.COMMENT, tokenize.STRING)
        ]
    except (tokenize.TokenError, IndentationError, SyntaxError):  # a known code that does not lex: the rough way
        return [m.span() for m in _PY_NOT_CODE.finditer(text)]


def _in_body(text: str, code: np.ndarray, comment: str) -> np.ndarray:
    """Whether each character of `text` is inside a body: on an indented line (Python), or within braces (the
    C family, counted over code only). A signature, an import or a top-level line is no place to turn a copy: a
    new first line (an import) before the parent's code was the embedded model's usual way out, a child that runs
    as its parent."""
    inside = np.zeros(len(text), dtype=bool)
    if comment == "#":
        at = 0
        for line in text.splitlines(keepends=True):
            inside[at : at + len(line)] = line[:1] in (" ", "\t")
            at += len(line)
        return inside
    depth = 0
    for i, ch in enumerate(text):
        if code[i] and ch == "}":
            depth -= 1
        inside[i] = depth > 0
        if code[i] and ch == "{":
            depth += 1
    return inside


@dataclass(frozen=True)
class KnownCode:
    """A code the group already has as the guard compares it (`comparable`), and whether a copy of it may be
    turned at each of its characters: code (not a comment or a string), inside a body."""

    squeezed: str
    turnable: np.ndarray  # bool per character of `squeezed`

    @classmethod
    def of(cls, text: str, comment: str) -> KnownCode:
        code = np.ones(len(text), dtype=bool)
        for start, end in _not_code_spans(text, comment):
            code[start:end] = False
        turnable = code & _in_body(text, code, comment)
        kept = np.array([not ch.isspace() for ch in text], dtype=bool)
        at = 0
        for line in text.splitlines(keepends=True):
            if _unread(line, comment):
                kept[at : at + len(line)] = False
            at += len(line)
        squeezed, flags = comparable(text, comment), turnable[kept]
        if flags.shape[0] != len(squeezed):  # a whitespace the regex and str.isspace judge apart: never turn there
            flags = np.zeros(len(squeezed), dtype=bool)
        return cls(squeezed, flags)


@dataclass
class GuardCounts:
    """How often the guard turned a row (for benchmarks/yield.py and the policy's tallies)."""

    turned: int = 0  # steps at which copying tokens were masked
    learned: int = 0  # finished blocks added to the known codes


@dataclass
class GroupGuard:
    """The known codes of one group, shared by its rows, which add each block they finish."""

    comment: str  # the fence language's line comment ("#", "//"; "" for none)
    known: list[KnownCode] = field(default_factory=list)
    counts: GuardCounts = field(default_factory=GuardCounts)
    doubt: float = DOUBT

    @classmethod
    def of(cls, codes: Sequence[str], comment: str, counts: GuardCounts | None = None) -> GroupGuard:
        """The group's guard, knowing `codes` from the start; its turns and the blocks it learns from its rows are
        counted in `counts` (a policy's tally over its calls) where given."""
        guard = cls(comment)
        for code in codes:
            guard.learn(code)
        guard.counts = counts if counts is not None else GuardCounts()
        return guard

    def learn(self, code: str) -> None:
        known = KnownCode.of(code.strip("\n"), self.comment)
        if known.squeezed and all(k.squeezed != known.squeezed for k in self.known):
            self.known.append(known)
            self.counts.learned += 1


@dataclass
class PartialLine:
    """A row's unfinished line as compared so far: how far it is read, its length without whitespace, and which of
    the row's copied codes it still continues."""

    read_to: int  # the row's text is read up to here
    length: int
    copied: list[KnownCode]


Allowed = Callable[[np.ndarray], np.ndarray]  # token ids -> may each come next (as policies.sampling's)


class TokenTexts:
    """Each token id's text as the guard compares it (whitespace removed), read once per vocabulary, and its
    first character's code (0: whitespace only or no text), so that a turn judges the whole vocabulary (when the
    likeliest tokens all copy) by the few ids that could continue a copy."""

    def __init__(self, texts: Sequence[str | None]) -> None:
        self.raw = [t or "" for t in texts]
        self.squeezed = [squeeze(t) for t in self.raw]
        self.first = np.array([ord(t[0]) if t else 0 for t in self.squeezed], dtype=np.int64)


# Where str.splitlines breaks a line ("\r\n" ends one line there; here the "\n" after a "\r" ends an empty one,
# which compares as nothing, so the two agree on what a code compares as).
_LINE_END = re.compile("[\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")


@dataclass
class RowGuard:
    """One row's view: its text so far, and the mask for its next token.

    Its work per token does not grow with the row: fences are counted in the new text only, and each line of the
    open block is compared once, when it ends, with the known codes still copied (a row of 20,000 one-character
    tokens would otherwise cost seconds per token at its end: benchmarks/copy_guard_speed.py)."""

    group: GroupGuard
    vocab: TokenTexts
    text: str = ""
    _fences: int = 0  # fences in `text` (counted left to right without overlap, as str.count does)
    _scan: int = 0  # where the next fence may start: after the last one counted
    _open_at: int = -1  # just after the open block's fence (-1: no open block)
    _code_at: int = -1  # where the open block's code starts, after its fence's line (-1: that line goes on)
    _line_at: int = 0  # where the open block's unfinished line starts
    _done: int = 0  # the length of the block's finished lines, as the guard compares them
    _copied: list[KnownCode] = field(default_factory=list)  # known codes the finished lines are a prefix of
    _known_seen: int = 0  # how many of the group's known codes `_copied` was chosen from
    _tail: PartialLine | None = None  # the unfinished line as compared so far (None: compare it afresh)

    def accept(self, token: int) -> None:
        """The row's next token."""
        self.write(self.vocab.raw[token])

    def write(self, piece: str) -> None:
        """The row's next text; a fenced block it closes is a known code from now on."""
        before = len(self.text)
        self.text += piece
        at = self.text.find(FENCE, max(self._scan, before - len(FENCE) + 1))
        while at >= 0:
            self._fences += 1
            self._scan = at + len(FENCE)
            if self._fences % 2:
                self._open_at, self._code_at = self._scan, -1
            else:
                body = self.text[self._open_at : at]
                self.group.learn(body.split("\n", 1)[1] if "\n" in body else "")
                self._open_at = self._code_at = -1
            at = self.text.find(FENCE, self._scan)
        if self._open_at < 0:
            return
        if self._code_at < 0:
            newline = self.text.find("\n", self._open_at)
            if newline < 0:
                return
            self._code_at = self._line_at = newline + 1
            self._done, self._copied, self._known_seen = 0, list(self.group.known), len(self.group.known)
            self._tail = None
        self._finish_lines(max(self._line_at, before))

    def _finish_lines(self, search_from: int) -> None:
        """Compare each line of the open block that ended in the new text, and keep the codes it still copies."""
        comment = self.group.comment
        while (end := _LINE_END.search(self.text, search_from)) is not None:
            line = self.text[self._line_at : end.end()]
            if not _unread(line, comment):
                squeezed = squeeze(line)
                self._copied = [k for k in self._copied if k.squeezed.startswith(squeezed, self._done)]
                self._done += len(squeezed)
            self._line_at = search_from = end.end()
            self._tail = None

    def _sync_known(self) -> None:
        """Codes the group learned after this block opened (another row's finished block) join the copied ones
        that the block's finished lines are a prefix of (a rare event: the finished lines are compared whole)."""
        if len(self.group.known) == self._known_seen:
            return
        finished = comparable(self.text[self._code_at : self._line_at], self.group.comment)
        self._copied += [k for k in self.group.known[self._known_seen :] if k.squeezed.startswith(finished)]
        self._known_seen = len(self.group.known)
        self._tail = None

    def rests(self) -> list[str] | None:
        """What each known code the row is copying has left to write, where a copy may be turned here (inside a
        fenced block, at a point of code in a body of every such code, none of them complete); else None."""
        if self._code_at < 0:
            return None
        self._sync_known()
        if _unread(self.text[self._line_at : self._line_at + UNREAD_PREFIX], self.group.comment):
            at, copied = self._done, self._copied
        else:
            tail = self._partial_line()
            at, copied = self._done + tail.length, tail.copied
        if not copied or any(at >= len(k.squeezed) or not k.turnable[at] for k in copied):
            return None
        return [k.squeezed[at:] for k in copied]

    def _partial_line(self) -> PartialLine:
        """The unfinished line, compared with the codes still copied in the text written since it was last compared
        only: its cost per token does not grow with the line."""
        if self._tail is None:
            self._tail = PartialLine(self._line_at, 0, list(self._copied))
        tail = self._tail
        new = squeeze(self.text[tail.read_to :])
        if new:
            tail.copied = [k for k in tail.copied if k.squeezed.startswith(new, self._done + tail.length)]
            tail.length += len(new)
        tail.read_to = len(self.text)
        return tail

    def turn(self, logits: np.ndarray, temperature: float, held: Allowed | None = None) -> Allowed | None:
        """Where the row is copying and the model, at its sampling temperature, gives tokens that leave every
        known code (and that `held`, the row's grammar, allows) at least `doubt` of its mass, judged on its
        `CANDIDATES` likeliest tokens: the tokens the row may take instead; else None, nothing held."""
        rests = self.rests()
        if rests is None:
            return None
        top = np.argpartition(-logits, CANDIDATES - 1)[:CANDIDATES] if logits.shape[0] > CANDIDATES else None
        ids = top if top is not None else np.arange(logits.shape[0])
        scaled = logits.astype(np.float64) / max(temperature, 1e-5)
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        leaving = self._leaving(ids, rests) & (held(ids) if held is not None else True)
        mass = probs[ids][leaving].sum()
        if mass < self.group.doubt:
            return None
        self.group.counts.turned += 1
        return lambda candidates: self._leaving(candidates, rests)

    def _leaving(self, ids: np.ndarray, rests: list[str]) -> np.ndarray:
        """Per id: does its token leave every known code here? Not whitespace alone (no change), not a comment or
        the start of one (none that runs: `/` may open `//` or `/*`), not an import (a line the guard does not
        compare: the copy would go on below it), not a continuation of a known code."""
        first = self.vocab.first[ids]
        out = first != 0
        comment = self.group.comment
        starts = {ord(rest[0]) for rest in rests} | {ord(c) for c in comment[:1] + "/#iuf"}
        for i in np.flatnonzero(np.isin(first, list(starts))):
            token = self.vocab.squeezed[int(ids[i])]
            if (
                (comment and (token.startswith(comment) or comment.startswith(token) or token.startswith("/*")))
                or token.startswith(IMPORT_WORDS.get(comment, OTHER_IMPORT_WORDS))
                or any(rest.startswith(token) or token.startswith(rest) for rest in rests)
            ):
                out[i] = False
        return out


def group_guard(params: SamplingParams, counts: GuardCounts) -> GroupGuard | None:
    """The guard of one sampling call, its turns tallied in `counts`: where the call gives codes to avoid and its
    answer is held to its shape; None otherwise. It judges fenced blocks only, which are whole rewrites of editable
    blocks in either format (`diff` answers may rewrite by fences too, and SEARCH/REPLACE edits stand outside
    fences). The one rule both in-process policies (llama.cpp, transformers) follow."""
    shape = params.structured
    if not params.avoid or shape is None:
        return None
    return GroupGuard.of(params.avoid, LINE_COMMENTS.get(shape.language, ""), counts)


def both(first: Allowed | None, second: Allowed | None) -> Allowed | None:
    """The tokens two holds both allow (either may be None: no hold); None when neither holds."""
    if first is None or second is None:
        return first or second
    return lambda ids: first(ids) & second(ids)
