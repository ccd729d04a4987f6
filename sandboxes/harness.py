"""Runs inside the sandbox: imports the candidate (and, in simple form, the evaluator) and reports JSON.

Stdlib only, since it runs in bare containers too. It is given a job and returns a reply dict; it never
sees expected answers or scoring code of split-form problems.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import json
import os
import signal
import sys
import traceback
import types


class CaseTimeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise CaseTimeout()


# ---- errors the candidate's code raised into ours or the evaluator's (the reply's "swallowed") ----------------
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


class NoLog:
    """A job that asks for no record (no `candidate_files`): notes nothing."""

    def note(self, exc):
        pass

    def entries(self, workdir):
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


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _jsonable(value):
    if hasattr(value, "tolist"):
        value = value.tolist()
    json.dumps(value, allow_nan=True)
    return value


def _failure(exc):
    # An evaluator marks a program invalid by raising any exception class named InvalidProgram.
    kind = "invalid" if type(exc).__name__ == "InvalidProgram" else "crash"
    kind = "memory" if isinstance(exc, MemoryError) else kind
    tail = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return {"kind": kind, "error": tail[:1000]}


def run_split(job, log):
    try:
        module = _load(job["program"], "candidate")
        entry = getattr(module, job["entry_point"])
    except BaseException as exc:
        log.note(exc) if isinstance(exc, Exception) else None
        return (
            _failure(exc)
            if not isinstance(exc, AttributeError)
            else {"kind": "invalid", "error": f"program defines no {job['entry_point']}()"}
        )
    outputs = {}
    case_timeout = job.get("case_timeout_s")
    signal.signal(signal.SIGALRM, _on_alarm)
    for name, case_input in job["inputs"]:
        try:
            if case_timeout:
                signal.setitimer(signal.ITIMER_REAL, case_timeout)
            value = entry(case_input)
            signal.setitimer(signal.ITIMER_REAL, 0)
            outputs[name] = {"ok": _jsonable(value)}
        except CaseTimeout:
            outputs[name] = {"kind": "timeout", "error": f"case exceeded {case_timeout}s"}
        except BaseException as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            outputs[name] = _failure(exc)
            log.note(exc) if isinstance(exc, Exception) else None
    return {"outputs": outputs}


def install_modules(sources):
    """Make modules the engine ships with the job importable (the `openevolve.evaluation_result` stand-in)."""
    for name, source in (sources or {}).items():
        parent, _, leaf = name.rpartition(".")
        if parent and not hasattr(sys.modules.get(parent), "__path__"):
            package = types.ModuleType(parent)
            package.__path__ = []
            sys.modules[parent] = package
        module = types.ModuleType(name)
        sys.modules[name] = module
        exec(compile(source, f"<{name}>", "exec"), module.__dict__)
        if parent:
            setattr(sys.modules[parent], leaf, module)


def run_simple(job):
    """Simple form: the evaluator runs here, beside the candidate; `_evolve_simple` (shipped with the job)
    turns what it returns, or its cascade of stages, into the reply."""
    try:
        evaluator = _load(job["evaluator"], "evaluator")
        return sys.modules["_evolve_simple"].evaluate(evaluator, job)
    except BaseException as exc:
        return _failure(exc)


def run_job(job):
    """The reply to one job, with what the candidate's code raised into ours or the evaluator's (`swallowed`)."""
    files = job.get("candidate_files")  # None: record nothing (benchmarks/error_capture_cost.py's "before")
    log = EscapeLog(files) if files is not None else NoLog()
    reply = _run(job, log, files is not None)
    swallowed = log.entries(job.get("workdir", "."))
    return {**reply, "swallowed": swallowed} if swallowed and isinstance(reply, dict) else reply


def _run(job, log, watch):
    os.chdir(job.get("workdir", "."))
    sys.path.insert(0, os.path.dirname(job["program"]))
    try:
        install_modules(job.get("modules"))
    except BaseException as exc:
        return _failure(exc)
    native = job.get("native")
    if native:  # a program of any language: built here first, then run as its own process
        runner = sys.modules["_evolve_native"]
        failed = runner.build(native)
        if failed is not None:
            return failed
        if job["mode"] == "split":
            return runner.run_cases(job)
        os.environ["EVOLVE_RUN_COMMAND"] = json.dumps(native["run"])
        reply = run_simple(job)  # the evaluator runs the built program; the reply says how long the build took
        return {**reply, "build_s": native.get("build_s")}
    if job["mode"] == "split":
        return run_split(job, log)  # the harness calls the candidate itself: its own handlers note what escapes
    if watch:
        watch_candidate_imports(log)
    return run_simple(job)


def empty_stdin():
    """The candidate's stdin is /dev/null, on fd 0 itself: no extra descriptor is left open for it."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - fd 0 lives as long as the process


def keep_cpu_weight():
    """Give this session's autogroup the nice the engine asked for (sandboxes/cpu_share.py, weight_env): the kernel
    shares the CPU between sessions' autogroups first, and the candidate runs in a session of its own (bubblewrap's
    or the engine's setsid), at nice 0, so its own nice alone would change nothing against the engine. Here, not
    before exec: the engine's processes are not dumpable, and a fork of it may not write its /proc files."""
    import errno
    import time

    nice = os.environ.pop("EVOLVE_SANDBOX_NICE", "")  # set by the engine where it lowers the weight
    if not nice.isdigit():
        return
    for _ in range(25):  # a writer without CAP_SYS_ADMIN may change an autogroup once per 100 ms, machine-wide
        try:
            with open("/proc/self/autogroup", "w") as f:
                f.write(nice)
            return
        except OSError as exc:  # no autogroups (or turned off at boot): nice alone decides
            if exc.errno != errno.EAGAIN:
                return
        time.sleep(0.01)


def main():
    """Read one job from stdin, write the reply as one JSON line to the fd named in argv[1].

    argv[2], when given and not "-", is the uid to run as (the process sandbox's jail starts us as root with
    no other rights); argv[3], when given, caps the processes the candidate may have.
    """
    reply_fd = int(sys.argv[1])
    keep_cpu_weight()
    if len(sys.argv) > 2 and sys.argv[2] != "-":  # started as root in a jail: become the slot's uid first
        uid = int(sys.argv[2])
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid:
            raise SystemExit("harness: could not drop to the slot uid")
    if len(sys.argv) > 3:  # in a jail's own user namespace the kernel counts processes per namespace
        import resource

        resource.setrlimit(resource.RLIMIT_NPROC, (int(sys.argv[3]),) * 2)
    serve(reply_fd)


def serve(reply_fd):
    """Read one job line from fd 0, run it, and write the reply as one JSON line to `reply_fd`.

    Also the whole life of a candidate forked from the Docker sandbox's zygote: its job reaches it only here,
    through its own pipe, so no other process's memory ever held it.
    """
    os.set_inheritable(reply_fd, False)  # the candidate's own subprocesses get no reply pipe
    with open(0, "rb", closefd=False) as source:
        job = json.loads(source.readline())
    empty_stdin()
    reply = run_job(job)
    data = (json.dumps(reply, allow_nan=True, default=str) + "\n").encode()
    with os.fdopen(reply_fd, "wb") as out:
        out.write(data)


if __name__ == "__main__":
    main()
