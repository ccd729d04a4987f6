"""How much of a completion the parser reads and how long it may work on it: a size cap and a deadline.

Why both, when every rule of the parser is linear in the text: what a variant costs also grows with its parent
(each edit searches the parent, each fenced piece is parsed beside the parent's blocks), so a completion of
thousands of small edits against a large program is linear in each and slow in the product. The deadline bounds
the whole; the cap bounds every single step in between: no regex or `ast.parse` call on at most
MAX_COMPLETION_CHARS of text (plus the parent) holds the GIL for more than a fraction of a second, so Ctrl-C is
never kept waiting by the parser (a signal handler runs only between bytecodes of the main thread).

The deadline is cooperative: the parser calls `check()` between its stages, per variant, per edit, per file
section and per fenced piece. It counts the parsing thread's CPU time, not the wall clock: the loop parses
several groups at once on threads that share one GIL, and on a loaded machine a sound completion would
otherwise spend its second waiting for its turn and be refused. `check()` also asks the run whether it was
interrupted, so a Ctrl-C ends a parse at its next check instead of after all of a group's completions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

PARSE_SECONDS = 1.0  # CPU seconds one completion may take to parse; past them it is not read
# A larger completion is not read (a model's answer is a few thousand characters). The cap is on lines too:
# `ast.parse` of 256 KB of one-letter statements took 0.6-1.5 s in one call (no check can run inside it, and a
# red-team run then took 2-5 s to stop on SIGTERM); 64 KB of dense code or 4,096 short lines take under 0.1 s.
MAX_COMPLETION_CHARS = 64 * 1024
MAX_COMPLETION_LINES = 4096  # ~12k tokens at least: more than any configured max_new_tokens reads


class ParseTimeout(Exception):
    """The completion took longer than its deadline; `str()` is the parse_error detail."""


class ParseInterrupted(Exception):
    """The run was interrupted (Ctrl-C, SIGTERM) while a completion was being parsed."""


class Deadline:
    """`seconds` of this thread's CPU time from now, and the run's interrupt flag (`stop`), checked together."""

    def __init__(self, seconds: float, stop: Callable[[], bool] | None = None) -> None:
        self.seconds, self.stop = seconds, stop
        self.started = time.thread_time()

    def check(self) -> None:
        """Raise `ParseInterrupted` when the run was interrupted, `ParseTimeout` when the time is spent."""
        if self.stop is not None and self.stop():
            raise ParseInterrupted("the run was interrupted while a completion was parsed")
        if time.thread_time() - self.started >= self.seconds:
            raise ParseTimeout(f"parsing took longer than {self.seconds:g} s of CPU time; the completion is not read")


UNLIMITED = Deadline(math.inf)  # for callers that parse one piece by itself (tests, tools)


def oversize(text: str) -> str | None:
    """Why `text` is too large to be read, or None."""
    if len(text) > MAX_COMPLETION_CHARS:
        return f"the completion holds {len(text):,} characters, over the {MAX_COMPLETION_CHARS:,} read; it is not read"
    lines = text.count("\n") + 1
    if lines > MAX_COMPLETION_LINES:
        return f"the completion holds {lines:,} lines, over the {MAX_COMPLETION_LINES:,} read; it is not read"
    return None
