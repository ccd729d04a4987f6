"""The process a split-form evaluator's `cases()` and `score()` run in, apart from the engine (see trusted.py).

Why a process of its own: these functions are the problem author's code, fed what a candidate answered. One that
never returns (a loop on an odd output, a lock, a slow check) hung the engine's evaluation thread, which no one
can kill, and with it the run and Ctrl-C; a process can be killed at a deadline and started again.

Stdlib only, run by path with `python -P`: the engine sends its own `sys.path`. Frames both ways are an 8-byte
length and a pickle, on the pipes that were stdin and stdout; fd 0 then reads /dev/null and fd 1 writes to
stderr, so an evaluator that reads or prints cannot corrupt them. SIGINT is ignored (the terminal's Ctrl-C is
the engine's to handle; it kills this process when it wants it gone), and the process dies with the engine's
thread that started it (PR_SET_PDEATHSIG).
"""

import contextlib
import ctypes
import importlib.util
import os
import pickle
import signal
import struct
import sys

FRAME = struct.Struct(">Q")


def _read_exact(fd, size):
    chunks = []
    while size:
        chunk = os.read(fd, min(size, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def read_frame(fd):
    """The next message, or None at the end of the pipe (the engine is gone or closed us)."""
    head = _read_exact(fd, FRAME.size)
    if head is None:
        return None
    body = _read_exact(fd, FRAME.unpack(head)[0])
    return None if body is None else pickle.loads(body)


def write_frame(fd, message):
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    data = FRAME.pack(len(data)) + data
    while data:
        data = data[os.write(fd, data) :]


def _die_with_parent(parent):
    """SIGKILL when the engine goes (its starting thread, to the kernel); exit now if it is gone already."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)


def _private_pipes():
    """The protocol's descriptors, moved off fds 0 and 1."""
    fd_in, fd_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    return fd_in, fd_out


def _said(exc):
    try:
        return str(exc)
    except Exception:
        return "(its message could not be read)"


def _line(exc, evaluator):
    """ " at evaluate.py line N": the evaluator's last frame in the traceback, the line to read; else ""."""
    line, tb = None, exc.__traceback__
    while tb is not None:
        if os.path.realpath(tb.tb_frame.f_code.co_filename) == evaluator:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f" at {os.path.basename(evaluator)} line {line}" if line is not None else ""


def load(path, name):
    """The evaluator as module `name`, listed in sys.modules so that its functions and classes pickle."""
    folder = os.path.dirname(path)
    sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def score_one(module, case, output, evaluator):
    """("value", float or None, type name, feedback) or ("raised", type name, where, message): only plain values
    go back, so whatever score() returned, the engine never unpickles an object of the evaluator's."""
    try:
        result = module.score(case, output)
        feedback = None
        if isinstance(result, tuple):
            result, feedback = result[0], str(result[1])
        kind = type(result).__name__
        if isinstance(result, str | bytes):  # text is never a score, even "0.5": an output passed on unjudged
            return ("value", None, kind, feedback)
        try:
            value = float(result)
        except (TypeError, ValueError, OverflowError):
            value = None
        return ("value", value, kind, feedback)
    except BaseException as exc:  # SystemExit and the like too: score() judged the output unusable
        return ("raised", type(exc).__name__, _line(exc, evaluator), _said(exc)[:2000])


def _start(init, evaluator):
    """The evaluator imported and the first frame to send: ("cases", pickled list) when asked for its cases,
    ("ready", None) when given them, or ("error", one line)."""
    try:
        module = load(init["path"], init["module"])
    except BaseException as exc:
        return None, ("error", f"importing it raised {type(exc).__name__}{_line(exc, evaluator)}: {_said(exc)}")
    if init["cases"] is not None:
        return module, ("ready", None)
    try:
        raw = module.cases()
    except BaseException as exc:
        return None, ("error", f"cases() raised {type(exc).__name__}{_line(exc, evaluator)}: {_said(exc)}")
    try:
        return module, ("cases", pickle.dumps(raw, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as exc:
        why = f"{type(exc).__name__}: {_said(exc)}"
        return None, ("error", f"cases() returned what pickle cannot copy to the engine ({why}); return plain data")


def serve(fd_in, fd_out, init):
    """Import the evaluator, answer the case list (or take it), then score batches until the pipe ends."""
    evaluator = os.path.realpath(init["path"])
    sys.path[:] = init["sys_path"]
    module, first = _start(init, evaluator)
    write_frame(fd_out, (first[0], first[1][:1000] if first[0] == "error" else first[1]))
    if module is None:
        return
    cases = pickle.loads(init["cases"]) if init["cases"] is not None else None
    while (message := read_frame(fd_in)) is not None:
        verb, body = message
        if verb == "cases":
            cases = pickle.loads(body)
        elif verb == "score":
            for index, output in body:
                write_frame(fd_out, score_one(module, cases[index], output, evaluator))


def main():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent(int(sys.argv[1]))
    fd_in, fd_out = _private_pipes()
    init = read_frame(fd_in)
    if init is not None:
        with contextlib.suppress(BrokenPipeError):  # the engine stopped listening: nothing left to do
            serve(fd_in, fd_out, init)


if __name__ == "__main__":
    main()
