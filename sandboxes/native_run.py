"""Runs inside the sandbox, in the harness's process: builds a program of any language, then runs it per case.

Stdlib only. The engine ships it with each job of a problem that has `[run]` (as the module `_evolve_native`,
like `_evolve_simple`), so the build and the program run in the candidate's own sandbox: the same uid,
namespaces, cgroup, scratch and deadline as a Python candidate. The build and each run are process groups of
their own with their own limits (lowered from the sandbox's, never raised); output is read through a cap, and
whatever a group leaves behind is killed with it (what escapes the group dies with the job).

Split form: each case's input goes to the program as one JSON line on stdin and its stdout is read back as one
JSON value, so the trusted scorer sees the same outputs as from a Python `solve()`.
"""

import contextlib
import json
import os
import resource
import select
import signal
import subprocess
import time

LOG_CAP = 64 * 1024  # read of a build's output; the rest is drained and dropped
LOG_KEPT = 1800  # carried back: the head, where a compiler puts its first error
OUTPUT_CAP = 1 << 20  # one case's stdout
STDERR_KEPT = 400
MEMORY_WORDS = ("memory allocation", "Cannot allocate memory", "out of memory", "bad_alloc")


def _lowered(limit, value):
    """Set `limit` to `value` (soft and hard), never above the hard limit the sandbox already set."""
    _, hard = resource.getrlimit(limit)
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(limit, (value, value))


def limiter(memory_mb, max_file_mb, cpu_s):
    def apply():
        _lowered(resource.RLIMIT_AS, memory_mb << 20)
        _lowered(resource.RLIMIT_FSIZE, max_file_mb << 20)
        _lowered(resource.RLIMIT_CPU, int(cpu_s) + 1)

    return apply


def exchange(argv, data, timeout_s, cap, preexec, merge_stderr=False, env=None):
    """Run `argv` with `data` on stdin for at most `timeout_s`: (exit code, None on timeout; stdout; stderr).

    The child is a process group leader; the group is killed once it exits or its time is up. Reading stops
    when it has exited and its pipes are drained, not at EOF: a grandchild may hold them open for ever."""
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            start_new_session=True,
            preexec_fn=preexec,
            env=env,
        )
    except OSError as exc:
        return 127, b"", f"cannot start {argv[0]}: {exc.strerror or exc}".encode()
    deadline = time.monotonic() + timeout_s
    pidfd = os.pidfd_open(proc.pid)
    out_fd = proc.stdout.fileno()
    err_fd = None if merge_stderr else proc.stderr.fileno()
    streams = {fd: [] for fd in (out_fd, err_fd) if fd is not None}
    kept = dict.fromkeys(streams, 0)
    pending, writer = memoryview(data), proc.stdin.fileno()
    if not pending:
        proc.stdin.close()
        writer = None
    exited = False
    while True:
        left = deadline - time.monotonic()
        if left <= 0:  # also after it exited: a grandchild may write for ever
            break
        watch = [fd for fd in streams if kept.get(fd, -1) >= 0]
        if not exited:
            watch.append(pidfd)
        if not watch:
            break
        ready, writable, _ = select.select(watch, [writer] if writer is not None else [], [], 0 if exited else left)
        if writable:
            try:
                pending = pending[os.write(writer, pending[:65536]) :]
            except OSError:  # it closed its stdin: the rest of the input is not wanted
                pending = pending[:0]
            if not pending:
                proc.stdin.close()
                writer = None
        if not ready and not writable:
            break  # exited and drained, or past the deadline
        for fd in ready:
            if fd == pidfd:
                exited = True
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                kept[fd] = -1
            elif kept[fd] < cap:
                streams[fd].append(chunk[: cap - kept[fd]])
                kept[fd] += len(streams[fd][-1])
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    os.close(pidfd)
    code = proc.wait() if exited else None
    if not exited:
        proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None and not stream.closed:
            stream.close()
    return code, b"".join(streams[out_fd]), b"".join(streams.get(err_fd, []))


def _ended(code, what):
    if code is None:
        return f"{what} ran past its time limit"
    if code >= 0:
        return f"{what} failed (exit {code})"
    try:
        name = signal.Signals(-code).name
    except ValueError:  # a real-time signal, which the enum lacks (valid_signals() has it): the harness failed
        name = f"signal {-code}"
    why = {"SIGXFSZ": ": a file past its size limit", "SIGXCPU": ": its CPU time limit"}.get(name, "")
    return f"{what} was killed by {name}{why}"


def build(native):
    """None when there is nothing to build or the build succeeded; else the job's reply: kind `build`."""
    spec = native.get("build")
    if not spec:
        return None
    started = time.monotonic()
    preexec = limiter(spec["memory_mb"], spec["max_file_mb"], spec["timeout_s"])
    env = {**os.environ, "LC_ALL": "C"}  # ASCII quotes in compiler messages: they go into prompts
    code, log, _ = exchange(spec["command"], b"", spec["timeout_s"], LOG_CAP, preexec, merge_stderr=True, env=env)
    native["build_s"] = time.monotonic() - started
    if code == 0:
        return None
    text = log.decode(errors="replace").strip()
    cut = "\n… (log cut)" if len(text) > LOG_KEPT else ""
    error = f"{_ended(code, 'the build')}:\n{text[:LOG_KEPT]}{cut}"
    return {"kind": "build", "error": error, "build_s": native["build_s"]}


def _case_failure(code, err):
    said = err.decode(errors="replace").strip()[-STDERR_KEPT:]
    if code is None:
        return {"kind": "timeout", "error": "the case ran past its time limit"}
    if code == -signal.SIGXCPU:
        return {"kind": "timeout", "error": "the case ran past its CPU time limit"}
    kind = "memory" if any(w in said for w in MEMORY_WORDS) else "crash"
    return {"kind": kind, "error": f"{_ended(code, 'the program')}; stderr: {said}" if said else _ended(code, "it")}


def run_cases(job):
    """Split form: run the built program once per case; the reply carries each case's output or failure."""
    native = job["native"]
    preexec = limiter(native["memory_mb"], native["max_file_mb"], native["timeout_s"])
    deadline = time.monotonic() + native["timeout_s"]
    case_timeout = job.get("case_timeout_s")
    outputs = {}
    for name, case_input in job["inputs"]:
        left = deadline - time.monotonic()
        if left <= 0:
            outputs[name] = {"kind": "timeout", "error": "the evaluation ran past its time limit before this case"}
            continue
        data = (json.dumps(case_input) + "\n").encode()
        code, out, err = exchange(native["run"], data, min(left, case_timeout or left), OUTPUT_CAP, preexec)
        if code != 0:
            outputs[name] = _case_failure(code, err)
            continue
        try:
            outputs[name] = {"ok": json.loads(out)}
        except (ValueError, RecursionError):
            shown = out[:80].decode(errors="replace")
            outputs[name] = {"kind": "bad_output", "error": f"stdout is not one JSON value: {shown!r}"}
    return {"outputs": outputs, "build_s": native.get("build_s")}
