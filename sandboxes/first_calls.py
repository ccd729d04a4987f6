"""Runs inside the sandbox, for the problem's seed alone: the first call of each function of the editable code that
the fixed code calls, with its real arguments (`priority({'time': 11, 'urgent': False, 'due': 272})`), for prompts
to show beside the function's name.

Why: told only to define `priority(job)`, the embedded 0.5B model wrote the whole schedule inside it, iterating over
one job as if it were the list; shown one real call in the problem's description, its children that beat their
parent per 1k tokens rose 1.52 times on job_priority (12 seeds, docs/yield.md). The engine asks for this only when
the program is the problem's own seed (sandboxes/scoring.py) and keeps it only from the seed's evaluation
(evolve/commit.py), so no candidate can write what another program's prompt shows.

Stdlib only: shipped with the job as `_evolve_first_calls`. A profile hook sees a call however the fixed code
reaches the function (its module's globals, an evaluator's attribute read, the harness's own call); it removes
itself once every name was seen, or after EVENT_CAP events, so a seed that never makes a call pays a bounded cost.
A call made in another process (an evaluator that runs the program as a subprocess) is not seen.
"""

import itertools
import os
import re
import reprlib
import sys
import threading

CALL_CAP = 300  # characters of one call as shown; the engine cuts to the same (evolve/problem/outcome.py)
EVENT_CAP = 5_000_000  # profile events before the hook gives up: a few seconds of the seed's evaluation at most
_VARARGS, _VARKEYWORDS = 0x04, 0x08  # code flags: the function takes *args, **kwargs
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # `<function f at 0x7f...>`: an address says nothing, and varies


class _Shown(reprlib.Repr):
    """A bounded repr: at most six items a container, three levels deep, 60 characters a string; a dict's keys in
    their own order (the base class sorts them, which is not the order the program built)."""

    def __init__(self):
        super().__init__()
        self.maxlevel = 3
        self.maxdict = self.maxlist = self.maxtuple = self.maxset = self.maxfrozenset = self.maxdeque = 6
        self.maxarray = 6
        self.maxstring = self.maxother = 60
        self.maxlong = 40

    def repr_dict(self, x, level):
        if not x:
            return "{}"
        if level <= 0:
            return "{...}"
        items = [
            f"{self.repr1(k, level - 1)}: {self.repr1(x[k], level - 1)}" for k in itertools.islice(x, self.maxdict)
        ]
        return "{" + ", ".join(items + (["..."] if len(x) > self.maxdict else [])) + "}"


class FirstCalls:
    """The first call of each of `names` made by code of the program's `files`, as text, while started."""

    def __init__(self, names, files):
        self.names = tuple(names)
        self.files = frozenset(os.path.realpath(f) for f in files)
        self.calls = {}  # name -> the call as shown, or None where showing it failed
        self._owned = {}  # a code object's file name -> whether it is one of the program's files
        self._events = 0
        self._shown = _Shown()

    def start(self):
        if self.names:
            threading.setprofile(self._hook)
            sys.setprofile(self._hook)

    def stop(self):
        sys.setprofile(None)
        threading.setprofile(None)

    def entries(self):
        """The calls seen, in the order of `names`."""
        return [self.calls[n] for n in self.names if self.calls.get(n) is not None]

    def _hook(self, frame, event, arg):
        self._events += 1
        if self._events > EVENT_CAP:
            sys.setprofile(None)
            return
        if event != "call":
            return
        code = frame.f_code
        name = code.co_name
        if name in self.calls or name not in self.names or not self._owns(code.co_filename):
            return
        try:
            self.calls[name] = _cut(_ADDRESS.sub("", f"{name}({', '.join(self._arguments(frame))})"))
        except Exception:  # an argument whose repr raised: nothing shown for this name
            self.calls[name] = None
        if len(self.calls) == len(self.names):
            sys.setprofile(None)

    def _owns(self, path):
        known = self._owned.get(path)
        if known is None:
            known = self._owned[path] = type(path) is str and os.path.realpath(path) in self.files
        return known

    def _arguments(self, frame):
        """The call's arguments as written at a call site: positional values, then `name=value` for the rest."""
        code, values = frame.f_code, frame.f_locals
        names = code.co_varnames
        positional, keyword_only = code.co_argcount, code.co_kwonlyargcount
        shown = [self._shown.repr(values[n]) for n in names[:positional]]
        at = positional + keyword_only
        if code.co_flags & _VARARGS:
            shown += [self._shown.repr(v) for v in values[names[at]]]
            at += 1
        shown += [f"{n}={self._shown.repr(values[n])}" for n in names[positional : positional + keyword_only]]
        if code.co_flags & _VARKEYWORDS:
            shown += [f"{k}={self._shown.repr(v)}" for k, v in values[names[at]].items()]
        return shown


def _cut(text):
    return text if len(text) <= CALL_CAP else text[: CALL_CAP - 4] + "...)"
