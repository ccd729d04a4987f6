"""Runs inside the sandbox: imports the candidate (and, in simple form, the evaluator) and reports JSON.

Stdlib only, since it runs in bare containers too. It is given a job and returns a reply dict; it never
sees expected answers or scoring code of split-form problems.
"""

from __future__ import annotations

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


class NoLog:
    """A job that asks for no record (no `candidate_files`): notes nothing."""

    def note(self, exc):
        pass

    def entries(self, workdir):
        return []


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
    """The reply to one job, with what the candidate's code raised into ours or the evaluator's (`swallowed`,
    counted by `_evolve_escapes`, which the engine ships with the job)."""
    try:
        install_modules(job.get("modules"))
    except BaseException as exc:
        return _failure(exc)
    files, escapes = job.get("candidate_files"), sys.modules.get("_evolve_escapes")
    watch = files is not None and escapes is not None  # None: record nothing (benchmarks/error_capture_cost.py)
    log = escapes.EscapeLog(files) if watch else NoLog()
    probe = _first_calls(job)
    try:
        reply = _run(job, log, watch, probe)
    finally:
        probe.stop()
    swallowed, calls = log.entries(job.get("workdir", ".")), probe.entries()
    if not isinstance(reply, dict):
        return reply
    return {**reply, **({"swallowed": swallowed} if swallowed else {}), **({"first_calls": calls} if calls else {})}


class NoCalls:
    """A job that asks for no first calls (any program but the problem's seed): sees nothing."""

    def start(self):
        pass

    def stop(self):
        pass

    def entries(self):
        return []


def _first_calls(job):
    """The seed's job names the functions whose first call to record (`_evolve_first_calls`, shipped with it)."""
    asked, module = job.get("first_calls"), sys.modules.get("_evolve_first_calls")
    if not asked or module is None:
        return NoCalls()
    return module.FirstCalls(asked["names"], job["program"], asked["block_lines"])


def _run(job, log, watch, probe):
    os.chdir(job.get("workdir", "."))
    sys.path.insert(0, os.path.dirname(job["program"]))
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
        probe.start()
        return run_split(job, log)  # the harness calls the candidate itself: its own handlers note what escapes
    if watch:
        sys.modules["_evolve_escapes"].watch_candidate_imports(log)
    probe.start()  # after the escape watcher: its view of the module hands out what the module's globals hold
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
