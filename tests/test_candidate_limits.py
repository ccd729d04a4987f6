"""What the process sandbox's seccomp filter and environment give a candidate, in the jail and outside it (WEAK).

- user namespaces: refused in every mode (as root bubblewrap makes none of its own, and a candidate could);
  clone3 says ENOSYS so that glibc falls back to clone, whose flags the filter can read;
- environment: exactly the names the sandbox sets, whatever the engine's own environment holds;
- memory held in socket buffers, which RLIMIT_AS does not count: bounded by the job's memory cgroup where it
  counts them, refused where none does (4 processes held 944 MiB each under memory_mb = 512 before).
Each case reads exact numbers from the score vector, then scores known programs for their exact vectors.
CI runs this file as root and, through scripts/test-as-user.sh, as an unprivileged user (no cgroup there).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from evolve.problem import load_problem
from evolve.problem.outcome import ErrorKind
from sandboxes.jail import jail_runtime
from sandboxes.process import ProcessSandbox
from sandboxes.seccomp import SocketRule
from tests.helpers import hiding_sandbox, weak_sandbox_or_skip
from tests.probes import constant_program, probe_problem
from tests.test_sandbox_memory import measured_twice_if_over

NAMESPACES = ("unshare", "clone", "clone3", "fork", "thread", "subprocess")
USERNS = """import ctypes, errno, os, subprocess, sys, threading
FOUND = {}
def _measure():
    libc = ctypes.CDLL(None, use_errno=True)
    clone = {"x86_64": 56, "aarch64": 220}[os.uname().machine]
    pid = os.fork()
    if pid == 0:  # each attempt in a child of its own: a success must not change the probing process
        ok = libc.unshare(0x10000000)  # CLONE_NEWUSER
        os._exit(100 if ok == 0 else ctypes.get_errno())
    unshare = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    pid = os.fork()
    if pid == 0:
        child = libc.syscall(clone, 0x10000000 | 17, 0, 0, 0, 0)  # CLONE_NEWUSER | SIGCHLD, like fork
        if child == 0:
            os._exit(0)
        if child > 0:
            os.waitpid(child, 0)
            os._exit(100)
        os._exit(ctypes.get_errno())
    cloned = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    clone3 = libc.syscall(435, 0, 0)
    clone3 = ctypes.get_errno() if clone3 == -1 else 100
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    forked = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    ran = []
    thread = threading.Thread(target=lambda: ran.append(1))
    thread.start()
    thread.join()
    out = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True, text=True).stdout
    return {"unshare": unshare, "clone": cloned, "clone3": clone3, "fork": forked, "thread": len(ran),
            "subprocess": int(out.strip() == "42")}
def solve(what):
    if not FOUND:
        FOUND.update(_measure())
    return FOUND[what]
"""
REFUSED = {"unshare": 1.0, "clone": 1.0, "clone3": 38.0, "fork": 7.0, "thread": 1.0, "subprocess": 1.0}

TRACING = ("traceme", "ptrace", "vm_read", "xattr")
# A candidate may neither trace (without root the jail's pid 1 has the candidate's uid: attached, its
# parent-death signal was cleared and the job's pid namespace outlived the job) nor hold kernel memory in
# extended attributes (uncounted by RLIMIT_AS and tmpfs sizes). The targets are its own children, which it could
# trace anywhere without the filter, as root too: a child asking to be traced (PTRACE_TRACEME), and a child that
# has exec'd a program. (A child merely forked would not do as root: the harness dropped to the slot's uid without
# exec, which leaves its process and its forks undumpable, so the kernel refused them to any tracer of that uid
# whatever the filter said, and the root pass never saw the filter at work.) Each number is the errno (100: it
# worked).
TRACE = """import ctypes, os, signal
FOUND = {}
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
def _execd_child():
    r, w = os.pipe()  # close-on-exec: the read ends once the child has exec'd (a dumpable process again)
    child = os.fork()
    if child == 0:
        os.close(r)
        os.execv("/bin/sleep", ["sleep", "30"])
    os.close(w)
    os.read(r, 1)
    os.close(r)
    return child
def _measure():
    libc = ctypes.CDLL(None, use_errno=True)
    got = {}
    child = os.fork()
    if child == 0:
        os._exit(100 if libc.ptrace(0, 0, 0, 0) == 0 else ctypes.get_errno())  # PTRACE_TRACEME
    got["traceme"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    child = _execd_child()
    got["ptrace"] = 100 if libc.ptrace(16, child, 0, 0) == 0 else ctypes.get_errno()  # PTRACE_ATTACH
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    child = _execd_child()
    with open(f"/proc/{child}/maps") as maps:  # the start of its first mapping: an address it surely has
        start = int(maps.readline().split("-")[0], 16)
    buf = ctypes.create_string_buffer(8)
    local, remote = IoVec(ctypes.addressof(buf), 8), IoVec(start, 8)
    read = libc.process_vm_readv(child, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    got["vm_read"] = 100 if read >= 0 else ctypes.get_errno()
    os.kill(child, signal.SIGKILL)
    os.waitpid(child, 0)
    path = "/tmp/xattr-probe"
    open(path, "w").close()
    try:
        os.setxattr(path, "user.hold", b"x" * 1024)
        got["xattr"] = 100
    except OSError as exc:
        got["xattr"] = exc.errno
    return got
def solve(what):
    if not FOUND:
        FOUND.update(_measure())
    return FOUND[what]
"""
EPERM_ALL = {"traceme": 1.0, "ptrace": 1.0, "vm_read": 1.0, "xattr": 1.0}

LEFTOVER = ("left",)
# Leaves a process that quits its session and drops the job's token from its environment (the sweep outside
# the jail matched on both), then rewrites every later job's program to answer -7 for 20 s.
REWRITE = """
import glob, sys, time
end = time.time() + 20
while time.time() < end:
    for path in glob.glob(sys.argv[1]):
        try:
            with open(path, "w") as f:
                f.write("def solve(what):\\n    return -7\\n")
        except OSError:
            pass
    time.sleep(0.0005)
"""
SURVIVOR = f"""import os, sys
def solve(what):
    pattern = os.path.join(os.path.dirname(os.getcwd()), "*", "seed.py")
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execve(sys.executable, [sys.executable, "-c", {REWRITE!r}, pattern], {{}})
        os._exit(0)
    os.wait()
    return 0
"""

ENVIRONMENT = ("names",)
NAMES = """import os
def solve(what):
    print(sorted(os.environ))
    return 1 if sorted(os.environ) == WANT else 0
"""

SOCKETS = ("held", "refused")
HOLD_MB = 384
SOCKET_HOG = f"""import os, socket, time
def _pair():
    try:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        a = socket.create_connection(server.getsockname())
        b, _ = server.accept()
        server.close()
        return a, b
    except OSError:  # refused, or no loopback (outside the jail)
        return socket.socketpair()
def _hold(budget):
    held, total, chunk = [], 0, b"\\1" * 65536
    try:
        while total < budget:
            a, b = _pair()
            for s in (a, b):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)
                s.setblocking(False)
            try:
                while total < budget:  # nobody reads: the bytes stay in the kernel's socket queues
                    total += a.send(chunk)
            except BlockingIOError:
                pass
            held.append((a, b))
    except PermissionError:
        os._exit(2)
    except OSError:
        os._exit(3)
    time.sleep(2.0)
    os._exit(0)
FOUND = {{}}
def solve(what):
    if not FOUND:
        kids = []
        for _ in range(4):  # {HOLD_MB} MiB each, 1.5 GiB in all at most: then it stops
            pid = os.fork()
            if pid == 0:
                _hold({HOLD_MB} << 20)
            kids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(kid, 0)[1]) for kid in kids]
        FOUND.update(held=codes.count(0), refused=codes.count(2))
    return FOUND[what]
"""


@pytest.fixture(scope="module", params=["jail", "weak"])
def box(request) -> Iterator[ProcessSandbox]:
    sandbox = weak_sandbox_or_skip(slots=1) if request.param == "weak" else hiding_sandbox("process", slots=1)
    yield sandbox
    sandbox.close()


def assert_known(box: ProcessSandbox, problem_dir, probes: tuple[str, ...]) -> None:
    """Two constant programs, one after the other, get exactly their own vectors."""
    problem = load_problem(problem_dir)
    for shift in (1, 5):
        values = {p: float(i + shift) for i, p in enumerate(probes)}
        assert box.evaluate(problem, constant_program(values)).scores == values


def test_user_namespaces_are_refused_to_candidates(box, tmp_path):
    folder = probe_problem(tmp_path / "ns", NAMESPACES)
    outcome = box.evaluate(load_problem(folder), USERNS)
    assert outcome.scores == REFUSED, (outcome.error, outcome.case_errors)
    assert_known(box, folder, NAMESPACES)


def test_tracing_and_extended_attributes_are_refused_to_candidates(box, tmp_path):
    folder = probe_problem(tmp_path / "trace", TRACING)
    outcome = box.evaluate(load_problem(folder), TRACE)
    assert outcome.scores == EPERM_ALL, (outcome.error, outcome.case_errors, outcome.stderr)
    assert_known(box, folder, TRACING)


def test_a_leftover_without_session_or_token_cannot_rewrite_later_jobs(box, tmp_path):
    folder = probe_problem(tmp_path / "left", LEFTOVER)
    assert box.evaluate(load_problem(folder), SURVIVOR).scores == {"left": 0.0}
    for _ in range(3):
        assert_known(box, folder, LEFTOVER)


def test_a_candidate_sees_exactly_the_sandbox_environment(box, tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLVE_TEST_ENGINE_SECRET", "engine-secret")
    want = {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONDONTWRITEBYTECODE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"}
    want |= {"EVOLVE_SANDBOX_TOKEN"} | {k for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    if box.hides_files:
        want.add("PWD")  # bubblewrap's --chdir sets it, after every --unsetenv: /work
        if jail_runtime().library_path is not None:
            want.add("LD_LIBRARY_PATH")  # the jail's moved libpython
    folder = probe_problem(tmp_path / "env", ENVIRONMENT)
    outcome = box.evaluate(load_problem(folder), NAMES.replace("WANT", repr(sorted(want))))
    assert outcome.scores == {"names": 1.0}, (sorted(want), outcome.stdout, outcome.error)
    assert_known(box, folder, ENVIRONMENT)


def test_socket_buffers_are_bounded_or_refused(box, tmp_path):
    folder = probe_problem(tmp_path / "sockets", SOCKETS, timeout_s=30)
    problem = load_problem(folder)
    outcome, drop = measured_twice_if_over(lambda: box.evaluate(problem, SOCKET_HOG), 512 + 256)
    if box.sockets is SocketRule.NONE:  # no memory cgroup: none may be made
        assert outcome.scores == {"held": 0.0, "refused": 4.0}, (outcome.error, outcome.case_errors)
    else:  # TCP refused on cgroup v1, AF_UNIX counted: the job's cgroup ends it
        assert outcome.error_kind == ErrorKind.MEMORY, (outcome.scores, outcome.error)
    assert drop["mb"] < 512 + 256, drop
    assert_known(box, folder, SOCKETS)
