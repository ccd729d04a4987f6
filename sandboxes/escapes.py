"""Runs inside the sandbox, in the harness's process: the exceptions the candidate's code raised into code that is
not its own (the harness, the evaluator), which an evaluator's `except Exception: score = 0` hides otherwise.

Stdlib only. The engine ships this source with every Python job (sandboxes/scoring.py) and the harness installs it
as the module `_evolve_escapes`, so the process and Docker sandboxes need no extra files. The split form notes what
escapes into the harness's own handlers; the simple form watches the candidate's modules as the evaluator imports
them (`watch_candidate_imports`). The reply carries the counts as `swallowed` (sandboxes/reply_shape.py checks
them; docs/sandboxes.md says what a candidate can and cannot do to them).
"""

import builtins
import importlib.machinery
import os
import sys
import types

# Bounded whatever the candidate raises: at most KINDS_HELD distinct (type, message, file, line) counted here, the
# KINDS_SENT most frequent sent; texts cut. Messages are made only from the exception's plain-data args by its
# builtin base class, so a candidate's own __str__, __repr__ or args property never runs in here.
KINDS_HELD, KINDS_SENT, MESSAGE_CAP, TYPE_CAP, FILE_CAP, WALK_CAP = 64, 8, 300, 100, 200, 10000
CODE_CAP = 120  # of the candidate's line that raised, as its file reads when the job ends
_PLAIN = (str, int, float, bool, type(None))
_BUILTIN_ERRORS = tuple(v for v in vars(builtins).values() if isinstance(v, type) and issubclass(v, BaseException))
_TYPE_NAME = type.__dict__["__name__"].__get__
_MRO = type.__dict__["__mro__"].__get__
_ARGS = BaseException.__dict__["args"].__get__
_TRACEBACK = BaseException.__dict__["__traceback__"].__get__
_SYNTAX_LINE = SyntaxError.__dict__["lineno"].__get__


def _clean(text, cap):
    """One line of valid UTF-8 at most `cap` characters: no lone surrogate, no line break to fake a line with."""
    text = text[: cap * 2].encode("utf-8", "replace").decode("utf-8")
    return " ".join(text.split())[:cap]


def _message(exc, cls):
    """The exception's message as its builtin base class words it, from plain args only (else its first text arg)."""
    args = _ARGS(exc)
    plain = tuple(a[: MESSAGE_CAP * 2] if type(a) is str else a for a in args if type(a) in _PLAIN)
    base = next((c for c in _MRO(cls) if c in _BUILTIN_ERRORS), Exception)
    if len(plain) == len(args) and not any(type(a) is int and abs(a) > 10**300 for a in plain):
        return str(base(*plain)) if base not in (UnicodeDecodeError, UnicodeEncodeError) else ""
    return args[0][: MESSAGE_CAP * 2] if args and type(args[0]) is str else "(a message that is not plain text)"


class EscapeLog:
    """Exceptions that escaped the candidate's code into code that is not its own (the harness, the evaluator),
    counted by what they were and the candidate's line that raised them. Only the harness and its watchers call
    `note`, with the exception in hand; nothing of the candidate's is read but plain data."""

    def __init__(self, files=()):
        self.files = frozenset(os.path.realpath(f) for f in files)
        self.counts = {}
        self.owned = {}  # path -> whether it is one of the candidate's files (realpath once per path)

    def owns(self, path):
        if type(path) is not str:
            return False
        known = self.owned.get(path)
        if known is None:
            known = self.owned[path] = os.path.realpath(path) in self.files
        return known

    def is_candidates(self, frame):
        return frame is not None and self.owns(frame.f_code.co_filename)

    def note(self, exc):
        try:
            cls = type(exc)
            key = (_clean(_TYPE_NAME(cls), TYPE_CAP), _clean(_message(exc, cls), MESSAGE_CAP), *self._where(exc, cls))
        except Exception:
            return
        if key in self.counts or len(self.counts) < KINDS_HELD:
            self.counts[key] = self.counts.get(key, 0) + 1

    def _where(self, exc, cls):
        """(file, line) of the innermost frame of the candidate's files in the traceback; a syntax error's own."""
        place, tb, steps = (None, None), _TRACEBACK(exc), 0
        while tb is not None and steps < WALK_CAP:
            if self.owns(tb.tb_frame.f_code.co_filename):
                place = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
            tb, steps = tb.tb_next, steps + 1
        if place[0] is None and issubclass(cls, SyntaxError) and type(_SYNTAX_LINE(exc)) is int:
            place = (None, _SYNTAX_LINE(exc))
        return place

    def entries(self, workdir):
        """The reply's `swallowed`: the most frequent first, each {type, message, file, line, count}. Checked again
        here, as it leaves: the candidate shares this process and may have reached the counts."""
        try:
            ranked = sorted(self.counts.items(), key=lambda item: -item[1])[:KINDS_SENT]
            return [_entry(key, count, workdir) for key, count in ranked]
        except Exception:
            return []


def _entry(key, count, workdir):
    kind, message, path, line = key
    if (
        type(count) is not int
        or count < 1
        or type(line) not in (int, type(None))
        or type(path) not in (str, type(None))
    ):
        raise ValueError("not a count of ours")
    where = None if path is None else _clean(os.path.relpath(path, workdir), FILE_CAP)
    return {
        "type": _clean(kind, TYPE_CAP),
        "message": _clean(message, MESSAGE_CAP),
        "file": where,
        "line": line,
        "code": _source_line(path, line),
        "count": count,
    }


def _source_line(path, line):
    """The text of `line` in the candidate's file (a model reads code without line numbers), or None."""
    if path is None or line is None or line < 1:
        return None
    try:
        with open(path, encoding="utf-8", errors="replace") as source:
            for number, text in enumerate(source, start=1):
                if number == line:
                    return _clean(text, CODE_CAP) or None
                if number > line:
                    break
    except OSError:
        return None
    return None


def _guarded(fn, log):
    """`fn` as the evaluator gets it from the candidate's module: what it raises into its caller is noted (not when
    the caller is the candidate's own code, which may catch it), then raised on unchanged."""

    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if not log.is_candidates(sys._getframe(1)):
                log.note(exc)
            raise

    for name in ("__name__", "__qualname__", "__doc__", "__module__"):
        setattr(wrapped, name, getattr(fn, name, None))
    wrapped.__wrapped__ = fn
    return wrapped


def watch_candidate_imports(log):
    """Note what escapes the candidate's modules, however an evaluator imports them (`spec_from_file_location`,
    `__import__`, `import`): their top-level code as it runs, and their functions as the evaluator gets them
    (`module.solve`, `from candidate import solve`). The candidate's own calls between its functions go straight
    to them (globals), so they cost nothing. Unwatched: a candidate's classes and generators, functions it makes
    or hands back later, and programs an evaluator runs by `exec` or in a subprocess."""
    loader = importlib.machinery.SourceFileLoader
    original = loader.exec_module

    def watched_module(namespace, wrappers):
        """A module class with a property for each function the module defined: reading it gives the function's
        wrapper while the module still holds that function (the candidate may rebind the name). Only those names
        pay for it; every other attribute, and the candidate's own global lookups, are read as before."""

        def watched(name, function, wrapper):
            def read(self):
                value = namespace.get(name, _MISSING)
                if value is _MISSING:
                    raise AttributeError(f"module has no attribute {name!r}")
                return wrapper if value is function else value

            def write(self, value):
                namespace[name] = value

            def delete(self):
                del namespace[name]

            return property(read, write, delete)

        functions = [(name, f) for name, f in namespace.items() if type(f) is types.FunctionType and f in wrappers]
        named = {name: watched(name, f, wrappers[f]) for name, f in functions}
        return type("WatchedModule", (types.ModuleType,), named)

    def exec_module(self, module):
        if not log.owns(getattr(module, "__file__", None)):
            return original(self, module)
        try:
            original(self, module)
        except Exception as exc:
            if not log.is_candidates(_importer(sys._getframe(1))):
                log.note(exc)
            raise
        namespace = vars(module)
        functions = [v for v in namespace.values() if type(v) is types.FunctionType]
        wrappers = {f: _guarded(f, log) for f in functions if log.owns(f.__code__.co_filename)}
        module.__class__ = watched_module(namespace, wrappers)

    loader.exec_module = exec_module


_MISSING = object()


def _importer(frame):
    """The first frame outside the import machinery: who asked for the import."""
    while frame is not None and ("importlib" in frame.f_code.co_filename):
        frame = frame.f_back
    return frame
