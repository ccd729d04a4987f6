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
# KINDS_SENT most frequent sent; texts cut. No code of the candidate's runs in here: classes are compared by
# identity (`id`, never `==`, which a metaclass may define), names and messages are read through the builtin
# descriptors and made exact `str` before any string operation, and a message is made only from the exception's
# plain-data args (exact types) by its builtin base class, so its own __init__, __str__, __repr__, __eq__ or args
# property never runs.
KINDS_HELD, KINDS_SENT, MESSAGE_CAP, TYPE_CAP, FILE_CAP, WALK_CAP = 64, 8, 300, 100, 200, 10000
CODE_CAP = 120  # of the candidate's line that raised, as its file reads when the job ends
_PLAIN = (str, int, float, bool, type(None))
_BUILTIN_ERRORS = {id(v): v for v in vars(builtins).values() if isinstance(v, type) and issubclass(v, BaseException)}
_TYPE_NAME = type.__dict__["__name__"].__get__
_MRO = type.__dict__["__mro__"].__get__
_ARGS = BaseException.__dict__["args"].__get__
_TRACEBACK = BaseException.__dict__["__traceback__"].__get__
_SYNTAX_LINE = SyntaxError.__dict__["lineno"].__get__


# C0 controls other than the whitespace `str.split` already folds: NUL among them, which PostgreSQL refuses in
# text (evolve/storable.py escapes it again as it is stored, whatever else sent it), shown as visible `\xNN`.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0E, 0x1C), 0x7F)}


def _clean(text, cap):
    """One line of valid UTF-8 at most `cap` characters: no lone surrogate, no line break to fake a line with, no
    control character (NUL, escape sequences) but as its visible `\\xNN`. `text` is an exact `str` (`_exact`)."""
    text = text[: cap * 2].encode("utf-8", "replace").decode("utf-8").translate(_CONTROLS)
    return " ".join(text.split())[:cap]


def _exact(text):
    """`text` as an exact `str` (a str subclass's own methods never run), or None when it is no str at all."""
    return str.__str__(text) if any(c is str for c in _MRO(type(text))) else None


def _is_exact(value, kinds):
    """Whether `value`'s type is one of `kinds`, by identity: `type(a) in kinds` would call a metaclass's `__eq__`."""
    kind = type(value)
    return any(kind is k for k in kinds)


def _builtin_base(cls):
    """The first builtin exception class in `cls`'s MRO, found by identity (Exception when none is)."""
    return next((_BUILTIN_ERRORS[id(c)] for c in _MRO(cls) if id(c) in _BUILTIN_ERRORS), Exception)


def _message(exc, cls):
    """The exception's message as its builtin base class words it, from plain args only (else its first text arg)."""
    args = tuple(_ARGS(exc))
    plain = tuple(a[: MESSAGE_CAP * 2] if type(a) is str else a for a in args if _is_exact(a, _PLAIN))
    base = _builtin_base(cls)
    if len(plain) == len(args) and not any(type(a) is int and abs(a) > 10**300 for a in plain):
        return str(base(*plain)) if base is not UnicodeDecodeError and base is not UnicodeEncodeError else ""
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
        """Count `exc`. Nothing it raises (a candidate's hook, a KeyboardInterrupt it sends meanwhile) leaves here:
        the job goes on to its normal reply, with this one exception uncounted."""
        try:
            cls = type(exc)
            name = _clean(_exact(_TYPE_NAME(cls)) or "?", TYPE_CAP)
            key = (name, _clean(_message(exc, cls), MESSAGE_CAP), *self._where(exc, cls))
            if key in self.counts or len(self.counts) < KINDS_HELD:
                self.counts[key] = self.counts.get(key, 0) + 1
        except BaseException:
            return

    def _where(self, exc, cls):
        """(file, line) of the innermost frame of the candidate's files in the traceback; a syntax error's own."""
        place, tb, steps = (None, None), _TRACEBACK(exc), 0
        while tb is not None and steps < WALK_CAP:
            if self.owns(tb.tb_frame.f_code.co_filename):
                place = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
            tb, steps = tb.tb_next, steps + 1
        syntax = any(c is SyntaxError for c in _MRO(cls))
        if place[0] is None and syntax and type(_SYNTAX_LINE(exc)) is int:
            place = (None, _SYNTAX_LINE(exc))
        return place

    def entries(self, workdir):
        """The reply's `swallowed`: the most frequent first, each {type, message, file, line, count}. Checked again
        here, as it leaves: the candidate shares this process and may have reached the counts."""
        try:
            ours = [(key, count) for key, count in list(self.counts.items()) if _is_ours(key, count)]
            ranked = sorted(ours, key=lambda item: -item[1])[:KINDS_SENT]
            return [_entry(key, count, workdir) for key, count in ranked]
        except BaseException:
            return []


def _is_ours(key, count):
    """Whether a count is of the shape `note` writes, checked by exact types only (no candidate's method runs)."""
    if type(key) is not tuple or len(key) != 4 or type(count) is not int or count < 1:
        return False
    kind, message, path, line = key
    return (
        type(kind) is str
        and type(message) is str
        and (path is None or type(path) is str)
        and (line is None or type(line) is int)
    )


def _entry(key, count, workdir):
    kind, message, path, line = key
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


def _note_escape(log, exc, caller):
    """Note `exc` unless `caller` is the candidate's own code (which may catch it). Whatever happens in here stays
    in here: the exception goes on unchanged, and the job to its normal reply."""
    try:
        if not log.is_candidates(caller):
            log.note(exc)
    except BaseException:
        pass


_FUNCTION = object.__getattribute__  # the proxy's own slots, read past its forwarding __getattribute__
_OWN = frozenset({"__call__", "__get__", "__reduce__", "__reduce_ex__"})


class _Guarded:
    """A function of the candidate's as the evaluator gets it from the candidate's module: calling it calls the
    function, and what it raises into its caller is noted (not when the caller is the candidate's own code), then
    raised on unchanged. Every attribute read, write and delete goes to the function itself, so the evaluator
    sees exactly the function's values (`__code__`, `__defaults__`, `__dict__`, what the program set on it,
    `__class__`, so `isinstance(f, types.FunctionType)` and `inspect.signature(f)` hold); only `type(f)` tells
    the two apart. As a method (`__get__`) it binds itself, so the call is watched there too. Made by `_guarded`,
    which gives each function its own subclass whose `__call__` holds the function in its closure: no attribute
    read per call."""

    __slots__ = ("_function", "_log")

    def __init__(self, function, log):
        object.__setattr__(self, "_function", function)
        object.__setattr__(self, "_log", log)

    def __get__(self, instance, owner=None):
        return self if instance is None else types.MethodType(self, instance)

    def __reduce_ex__(self, protocol):
        return _FUNCTION(self, "_function").__qualname__  # pickled by name, as the function itself is

    def __reduce__(self):
        return self.__reduce_ex__(2)

    def __getattribute__(self, name):
        if name in _OWN:
            return _FUNCTION(self, name)
        return getattr(_FUNCTION(self, "_function"), name)

    def __setattr__(self, name, value):
        setattr(_FUNCTION(self, "_function"), name, value)

    def __delattr__(self, name):
        delattr(_FUNCTION(self, "_function"), name)

    def __dir__(self):
        return dir(_FUNCTION(self, "_function"))

    def __repr__(self):
        return repr(_FUNCTION(self, "_function"))


def _guarded(function, log):
    """`function`, watched: a `_Guarded` whose calls note what escapes into a caller not the candidate's."""

    def __call__(self, *args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as exc:
            _note_escape(log, exc, sys._getframe(1))
            raise

    return type("WatchedFunction", (_Guarded,), {"__slots__": (), "__call__": __call__})(function, log)


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
                stand_in = STAND_INS.get(id(value))  # the seed's first-call recorder of this very function
                held = value is function or (stand_in is not None and stand_in[0] is value and stand_in[1] is function)
                return wrapper if held else value

            def write(self, value):
                namespace[name] = value

            def delete(self):
                del namespace[name]

            return property(read, write, delete)

        functions = [
            (name, f)
            for name, f in namespace.items()
            if type(name) is str and type(f) is types.FunctionType and f in wrappers
        ]
        named = {name: watched(name, f, wrappers[f]) for name, f in functions}
        return type("WatchedModule", (types.ModuleType,), named)

    def candidates(module):
        try:
            return log.owns(getattr(module, "__file__", None))
        except BaseException:  # a hook of a candidate's, loaded earlier, raised in here: that module goes unwatched
            return False

    def watch(module):
        """Watch the module's functions; whatever a candidate's hook raises meanwhile leaves it unwatched."""
        try:
            namespace = vars(module)
            functions = [v for v in namespace.values() if type(v) is types.FunctionType]
            wrappers = {f: _guarded(f, log) for f in functions if log.owns(f.__code__.co_filename)}
            module.__class__ = watched_module(namespace, wrappers)
        except BaseException:
            pass

    def exec_module(self, module):
        if not candidates(module):
            return original(self, module)
        try:
            original(self, module)
        except Exception as exc:
            _note_escape(log, exc, _importer(sys._getframe(1)))
            raise
        watch(module)

    loader.exec_module = exec_module


_MISSING = object()
# id -> (stand-in, function): the seed's first-call recorders (sandboxes/first_calls.py) put in a module's globals
# for the fixed code; a module's reader (an evaluator) is handed the function's watched wrapper instead, as before
# (pickled by name, inspected as the function, its exceptions counted), never the recorder.
STAND_INS = {}


def _importer(frame):
    """The first frame outside the import machinery: who asked for the import."""
    while frame is not None and type(frame.f_code.co_filename) is str and "importlib" in frame.f_code.co_filename:
        frame = frame.f_back
    return frame
