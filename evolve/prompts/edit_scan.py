"""SEARCH/REPLACE edits read from a variant's text in linear time, by locating markers rather than by one regex.

Why not one regex: the rule it replaces read the search text lazily and, at every character of it, tried a
divider and the rest of that divider's line; a line of 100,000 `=` without a newline after it cost 32 s
(quadratic), all of it inside one `re` call that held the GIL, so Ctrl-C waited too. RE2 would bound the time
but has no lookaheads, which the rule needs (a search text never runs past the next SEARCH marker), and is a
compiled dependency. Here each kind of marker is found in one pass, with a pattern that only starts at the first
character of a run of `<`, `>` or `=` (so each run, and the whitespace after it, is read a bounded number of
times), and the edits are then read off the sorted marker positions by bisection: O(n + k log k) for n
characters and k markers.

What is read is exactly what the old pattern read, byte for byte (tests/test_parser_hostile.py compares the two
on random marker soup), so every answer parses as before:

- an opener is 5 to 9 `<`, any whitespace (newlines too), `SEARCH`, and the rest of its line, which must end;
- the search text runs to the first divider after it: 5 or more `=` with a line end somewhere after them (a
  newline just before the `=` is not part of the text); it may not contain another opener, and when it would,
  that later opener is tried instead;
- the replacement, after the divider's line, runs to the first closing marker (5 to 9 `>`, whitespace,
  `REPLACE`, the rest of its line; a newline just before it is not part of the text), or to the next opener
  (which starts the next edit), or to the end of the text.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

# Each starts only where its run starts (the lookbehind), so a run of 100,000 `<` is one attempt, not 100,000.
_OPENERS = re.compile(r"(?<!<)(<{5,})\s*SEARCH")
_CLOSERS = re.compile(r"(?<!>)(>{5,})\s*REPLACE")
_DIVIDERS = re.compile(r"(?<!=)={5,}")


@dataclass(frozen=True)
class _Runs:
    """Where a marker may start: for run i, any position in [low[i], high[i]]; `after[i]` is where its word ends
    (SEARCH, REPLACE; dividers have none). Runs are disjoint and in order, so `high` is sorted and the first
    position at or after p is one bisection."""

    low: list[int]
    high: list[int]
    after: list[int]

    def first(self, p: int) -> tuple[int, int] | None:
        """(run index, first position >= p where a marker starts), or None when none does."""
        i = bisect.bisect_left(self.high, p)
        return None if i == len(self.high) else (i, max(self.low[i], p))


def _marked(pattern: re.Pattern[str], text: str) -> _Runs:
    """Runs of 5 or more `<` (or `>`) followed by their word: a marker of 5 to 9 starts at each of the last five
    positions before the word (further back, the 10th character is another `<` where whitespace must be)."""
    low, high, after = [], [], []
    for m in pattern.finditer(text):
        start, end = m.span(1)
        low.append(max(start, end - 9))
        high.append(end - 5)
        after.append(m.end())
    return _Runs(low, high, after)


def _dividers(text: str) -> _Runs:
    """Runs of 5 or more `=`: a divider starts wherever 5 `=` follow, if a newline comes somewhere after them."""
    last_newline = text.rfind("\n")
    low, high = [], []
    for m in _DIVIDERS.finditer(text):
        top = min(m.end() - 5, last_newline - 5)
        if top < m.start():
            break  # no newline after this run, nor after any later one
        low.append(m.start())
        high.append(top)
    return _Runs(low, high, [])


def _before_newline(text: str, start: int, at: int) -> int:
    """Where a marker found at `at` starts its match: a newline just before it, at or after `start`, is its."""
    return at - 1 if at - 1 >= start and text[at - 1] == "\n" else at


def find_edits(text: str) -> list[tuple[str, str]]:
    """(search text, replacement) of each SEARCH/REPLACE edit in `text`, in order (see the module docstring)."""
    openers, closers, dividers = _marked(_OPENERS, text), _marked(_CLOSERS, text), _dividers(text)
    edits: list[tuple[str, str]] = []
    run = bisect.bisect_left(openers.high, 0)
    while run < len(openers.high):
        line_end = text.find("\n", openers.after[run])
        if line_end < 0:
            break  # this opener's line never ends, nor does any later one's
        body = line_end + 1
        divider = dividers.first(body)
        if divider is None:
            break  # no divider after this opener, nor after any later one
        divider_at = divider[1]
        search_end = _before_newline(text, body, divider_at)
        intruder = openers.first(body)
        if intruder is not None and intruder[1] < search_end:
            run += 1  # another opener inside the search text: the edit starts there, if anywhere
            continue
        replace_start = text.find("\n", divider_at + 5) + 1  # found: a divider has a newline after it
        replace_end, resume = len(text), len(text)
        closer = closers.first(replace_start)
        if closer is not None:
            replace_end = _before_newline(text, replace_start, closer[1])
            line_end = text.find("\n", closers.after[closer[0]])
            resume = len(text) if line_end < 0 else line_end
        following = openers.first(replace_start)
        if following is not None and following[1] < replace_end:
            replace_end = resume = following[1]
        edits.append((text[body:search_end], text[replace_start:replace_end]))
        run = bisect.bisect_left(openers.high, resume)
    return edits
