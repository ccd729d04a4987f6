"""Runs inside the sandbox, for the problem's seed alone: the first call of each function of the editable code that
the fixed code (or the evaluator) makes, with its real arguments (`priority({'time': 11, 'urgent': False, 'due':
272})`), for prompts to show beside the function's name.

Why: told only to define `priority(job)`, the embedded 0.5B model wrote the whole schedule inside it, iterating over
one job as if it were the list; shown one real call in the problem's description, its children that beat their
parent per 1k tokens rose 1.52 times on job_priority (12 seeds, docs/yield.md). The engine asks for this only when
the program is the problem's own seed (sandboxes/scoring.py) and keeps it only from the seed's evaluation
(evolve/commit.py), so no candidate can write what another program's prompt shows.

Stdlib only: shipped with the job as `_evolve_first_calls`. How: when a module is loaded from the program's file
(the harness's own import in the split form, the evaluator's in the simple form: `SourceFileLoader.exec_module`),
each named function in its globals is replaced by a one-shot recorder, which the fixed code reaches through those
globals; an evaluator reading the module gets the function as before (the escape watcher's wrapper: pickled by
name, inspected as the function, its exceptions counted), so it is the fixed code's calls that are seen. The first
call made from outside the editable blocks is written down and the function put back, so the seed's evaluation
pays for one call of each, not for every call (a profile hook slowed a seed 3.5 times, which the run then took as
its timeout rule's measure). Calls from inside the blocks
are not the interface: after CALLS_FROM_BLOCKS of them the recorder gives up. Not seen: a function taken from the
module before its first call was recorded and kept (`KEY = priority` at import), calls in another process.
"""

import functools
import importlib.machinery
import itertools
import os
import re
import reprlib
import sys
import types

CALL_CAP = 300  # characters of one call as shown; the engine cuts to the same (evolve/problem/outcome.py)
CALLS_FROM_BLOCKS = 10_000  # calls from the editable code itself before a recorder puts the function back unseen
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")  # `<function f at 0x7f...>`: an address says nothing, and varies
# Shown by their own repr, whose length their value bounds; every other type is shown by its name (and length)
_OWN_REPR = (bool, int, float, complex, type(None), type, range, slice, types.FunctionType, types.BuiltinFunctionType)


class _Shown(reprlib.Repr):
    """A repr bounded in work as well as length: six items a container, three levels, 60 characters a string; a
    dict's keys in their own order (the base class sorts them); a container subclass shown as its base; any other
    object as `<TypeName>` or `<TypeName of N items>`, so a program's own `__repr__` does not run, however large.
    Left to reprlib: a set is sorted whole before it is cut, and a type is chosen by its name."""

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

    def repr_instance(self, x, level):
        for base, shown in ((dict, self.repr_dict), (list, self.repr_list), (tuple, self.repr_tuple)):
            if isinstance(x, base):
                return shown(x, level)
        if isinstance(x, str):
            return self.repr_str(str.__str__(x), level)
        if isinstance(x, bytes | bytearray):
            return repr(bytes(x[: self.maxstring])) + ("..." if len(x) > self.maxstring else "")
        if isinstance(x, _OWN_REPR):
            return reprlib.Repr.repr_instance(self, x, level)
        name = type(x).__name__
        try:
            return f"<{name} of {len(x)} items>"
        except Exception:
            return f"<{name}>"


class FirstCalls:
    """The first call of each of `names` made to the program's functions (loaded from `program`) from outside the
    editable `block_lines` ([first, last] line pairs of the program's file), as text, while started."""

    def __init__(self, names, program, block_lines):
        self.names = tuple(dict.fromkeys(names))
        self.program = os.path.realpath(program)
        self.block_lines = [(int(first), int(last)) for first, last in block_lines]
        self.calls = {}  # name -> the call as shown (None where showing it failed)
        self._shown = _Shown()
        self._put_back = None
        self._stand_ins = None

    def start(self):
        """Watch modules loaded from the program's file from now on (after the escape watcher, whose view of a
        module hands a reader the function's watched wrapper, never our recorder: `STAND_INS`)."""
        if not self.names:
            return
        escapes = sys.modules.get("_evolve_escapes")  # read now, before any code of the program's has run
        self._stand_ins = getattr(escapes, "STAND_INS", None) if escapes is not None else None
        loader = importlib.machinery.SourceFileLoader
        loaded = loader.exec_module
        probe = self

        def exec_module(self, module):
            loaded(self, module)
            if probe._is_program(getattr(module, "__file__", None)):
                probe.watch(vars(module))

        loader.exec_module = exec_module
        self._put_back = lambda: setattr(loader, "exec_module", loaded)

    def stop(self):
        if self._put_back is not None:
            self._put_back()
            self._put_back = None
        self._stand_ins = None

    def entries(self):
        """The calls seen, in the order of `names`."""
        return [self.calls[n] for n in self.names if self.calls.get(n) is not None]

    def watch(self, namespace):
        for name in self.names:
            function = namespace.get(name)
            if type(function) is types.FunctionType and self._is_program(function.__code__.co_filename):
                recorder = namespace[name] = self._recorder(namespace, name, function)
                if self._stand_ins is not None:  # a reader of the module gets the function's own watched wrapper
                    self._stand_ins[id(recorder)] = (recorder, function)

    def _recorder(self, namespace, name, function):
        probe, from_blocks = self, itertools.count(1)

        @functools.wraps(function)
        def first_call(*args, **kwargs):
            if name not in probe.calls:
                if not probe._in_blocks(sys._getframe(1)):
                    probe.calls[name] = probe._call(name, args, kwargs)
                elif next(from_blocks) < CALLS_FROM_BLOCKS:
                    return function(*args, **kwargs)
            if namespace.get(name) is first_call:
                namespace[name] = function
            return function(*args, **kwargs)

        return first_call

    def _call(self, name, args, kwargs):
        try:
            shown = [self._shown.repr(a) for a in args] + [f"{k}={self._shown.repr(v)}" for k, v in kwargs.items()]
        except Exception:  # an argument whose repr raised: nothing shown for this name
            return None
        text = " ".join(_ADDRESS.sub("", f"{name}({', '.join(shown)})").split()).replace("`", "'")  # one line
        return text if len(text) <= CALL_CAP else text[: CALL_CAP - 4] + "...)"

    def _in_blocks(self, frame):
        """Whether the caller is the editable code itself (a helper, a test call at import): not the interface."""
        code = frame.f_code
        if not self._is_program(code.co_filename):
            return False
        return any(first <= frame.f_lineno <= last for first, last in self.block_lines)

    def _is_program(self, path):
        return type(path) is str and os.path.realpath(path) == self.program
