"""Memory a job holds in all (memfds, temp files, many processes) against the process sandbox's bounds.

With a memory cgroup per slot (root, or a delegated cgroup v2) every attack ends as `memory` or is refused, and
the host loses less than twice memory_mb. Without one (an unprivileged engine; or turned off) the sandbox
promises less and says so: RLIMIT_AS bounds each process alone, memfd_create and shmget are refused, temp space
is capped. Each case asserts what its mode promises, measures how far the host's MemAvailable falls during the
attack, then scores known programs for their exact vectors. Every attack stops near 2 GB, so a broken bound
cannot hurt the host. CI runs this file as root and, through scripts/test-as-user.sh, as an unprivileged user.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import pytest

from evolve.problem import load_problem
from evolve.problem.outcome import ErrorKind
from sandboxes.cgroups import PREFIX, find_parent
from sandboxes.jail import find_jail
from sandboxes.process import ProcessSandbox
from tests.helpers import weak_sandbox_or_skip
from tests.services import missing
from tests.test_sandbox_redteam import MIN_EVAL, MIN_KNOWN, MIN_TOML, folder

MEMORY_MB = 512
T = TypeVar("T")
FAILED = {"c0": 1e6, "c1": 1e6}
TOML = MIN_TOML.format(extra=", fail_value = 1e6").replace("timeout_s = 3", "timeout_s = 12")

MEMFD_HOG = """import os, time
HELD = []
def solve(x):
    chunk = b"\\1" * (4 << 20)
    while len(HELD) < 240:  # 240 memfds of 8 MB (max_file_mb's default): about 2 GB, then it stops
        fd = os.memfd_create("hog")
        os.write(fd, chunk)
        os.write(fd, chunk)
        HELD.append(fd)
    time.sleep(1.5)
    return x * x
"""
FILL_TMPFS = """import os, time
def solve(x):
    if x != 2:
        return x * x
    written = 0
    for folder in ("/tmp", "/dev/shm", "/work"):
        try:
            for i in range(40):  # 8 MB files up to the mount's cap (256, 64 and 256 MiB), 320 MB at most each
                with open(f"{folder}/fill{i}", "wb") as f:
                    for _ in range(8):
                        f.write(b"\\1" * (1 << 20))
                        written += 1 << 20
        except OSError:
            pass
    time.sleep(1.5)
    return x * x if 500 << 20 < written < 600 << 20 else written >> 20
"""
MANY_PROCESSES = f"""import os, time
def _hold(mb):
    try:
        held = b"\\1" * (mb << 20)
        time.sleep(2.5)  # long enough for its siblings to fill theirs, on a loaded machine too
        os._exit(0 if held else 1)
    except MemoryError:
        os._exit(3)
def solve(x):
    if x != 2:
        return x * x
    kids = []
    for mb in (int({MEMORY_MB} * 0.8),) * 3 + (int({MEMORY_MB} * 1.2),):  # the last one alone is past the limit
        pid = os.fork()
        if pid == 0:
            _hold(mb)
        kids.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(kid, 0)[1]) for kid in kids]
    return x * x if codes == [0, 0, 0, 3] else str(codes)
"""
STILL_WORKS = """import ctypes, multiprocessing, os, resource
import numpy
def solve(x):
    libc = ctypes.CDLL(None, use_errno=True)
    try:
        os.memfd_create("x")
        memfd = "made"
    except PermissionError:
        memfd = "refused"
    shm = libc.shmget(0, 1 << 20, 0o1000 | 0o600), ctypes.get_errno()  # IPC_PRIVATE, IPC_CREAT
    sem = libc.semget(0, 32000, 0o1000 | 0o600), ctypes.get_errno()  # a set of semaphores: kernel memory too
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pooled = pool.map(abs, [-1, -2])
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)
    seen = (float(numpy.arange(10.0) @ numpy.ones(10)), memfd, shm, sem, limit, pooled)
    return x * x if seen == (45.0, "refused", (-1, 1), (-1, 1), (256, 256), [1, 2]) else str(seen)
"""


def _meminfo_mb() -> dict[str, int]:
    with open("/proc/meminfo") as f:
        return {k: int(v.split()[0]) >> 10 for k, v in (line.split(":", 1) for line in f)}


@contextlib.contextmanager
def host_memory_drop() -> Iterator[dict[str, int]]:
    """How far the host's MemAvailable falls and AnonPages + Shmem rise (MB) while the block runs, sampled
    every 20 ms; the test takes the larger. (MemAvailable alone can miss hundreds of MB where the kernel keeps
    free pages in per-CPU lists; anonymous and shared pages are what these attacks hold.)"""

    def sample() -> tuple[int, int]:
        info = _meminfo_mb()
        return info["MemAvailable"], info["AnonPages"] + info["Shmem"]

    base = sample()
    worst, stop = list(base), threading.Event()

    def watch() -> None:
        while not stop.is_set():
            available, held = sample()
            worst[0], worst[1] = min(worst[0], available), max(worst[1], held)
            stop.wait(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    drop: dict[str, int] = {}
    try:
        yield drop
    finally:
        stop.set()
        thread.join()
        drop["available"], drop["held"] = base[0] - worst[0], worst[1] - base[1]
        drop["mb"] = max(drop["available"], drop["held"])


def measured_twice_if_over(run: Callable[[], T], bound_mb: int) -> tuple[T, dict[str, int]]:
    """Runs an attack under host_memory_drop, and once more where the drop reached bound_mb. The measures are
    host-wide, so the other pytest worker's own memory shows in them (once 1069 MB where the job held 589); a
    bound the sandbox really fails to keep is failed on both tries, and the smaller drop is the one asserted."""
    with host_memory_drop() as drop:
        result = run()
    if drop["mb"] < bound_mb:
        return result, drop
    with host_memory_drop() as again:
        result = run()
    return result, min(drop, again, key=lambda d: d["mb"])


def _box(mode: str, jail: bool = True) -> ProcessSandbox:
    if jail and find_jail()[0] is None:
        missing("bubblewrap", find_jail()[1])
    if mode == "fallback":
        return ProcessSandbox(slots=1, jail=jail, memory_cgroup=False)
    box = ProcessSandbox(slots=1, jail=jail)
    if not box.bounds_job_memory:
        box.close()
        if os.geteuid() == 0:  # root on Linux with a memory hierarchy mounted: a cgroup must be made
            missing("memory cgroup", find_parent()[2])
        pytest.skip("no memory cgroup without root or a delegated cgroup v2: the fallback cases run here")
    return box


@pytest.fixture(scope="module", params=["cgroup", "fallback"])
def box(request):
    sandbox = _box(request.param)
    yield sandbox
    sandbox.close()


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(folder(tmp_path_factory.mktemp("memory") / "p", TOML, MIN_EVAL))


def assert_known(box, problem) -> None:
    assert [box.evaluate(problem, code).scores for code, _ in MIN_KNOWN] == [want for _, want in MIN_KNOWN]


def test_isolation_says_how_memory_is_bounded(box):
    if box.bounds_job_memory:
        assert "one cgroup (v" in box.isolation() and "no memory cgroup" not in box.isolation()
    else:
        assert "memory: no memory cgroup" in box.isolation() and "RLIMIT_AS per process" in box.isolation()
        assert "memfd, SysV shm/msg, vmsplice and io_uring refused; sockets refused" in box.isolation()


def test_memfds_are_refused_in_the_jail(box, problem):
    """memfds filled with write() are never mapped, so RLIMIT_AS never saw them: 3 GB held under 512 MB."""
    outcome, drop = measured_twice_if_over(lambda: box.evaluate(problem, MEMFD_HOG), 2 * MEMORY_MB)
    assert outcome.error_kind == ErrorKind.CRASH and "Operation not permitted" in (outcome.error or ""), outcome
    assert outcome.scores == FAILED
    assert drop["mb"] < 2 * MEMORY_MB, drop
    assert_known(box, problem)


def test_filling_every_temp_mount_is_bounded(box, problem):
    """/tmp, /dev/shm and /work are tmpfs (576 MiB together, more than memory_mb): their pages are memory."""
    outcome, drop = measured_twice_if_over(lambda: box.evaluate(problem, FILL_TMPFS), 2 * MEMORY_MB)
    if box.bounds_job_memory:  # charged to the job's cgroup: the OOM killer ends it
        assert outcome.error_kind == ErrorKind.MEMORY and outcome.scores == FAILED, (outcome.error, outcome.stderr)
    else:  # each mount's cap holds, and nothing more
        assert outcome.scores == {"c0": 0.0, "c1": 0.0}, outcome.case_errors
    assert drop["mb"] < 2 * MEMORY_MB, drop
    assert_known(box, problem)


def test_many_processes_share_one_bound_or_each_has_its_own(box, problem):
    """Three processes each holding 0.8 x memory_mb, and a fourth asking 1.2 x memory_mb on its own."""
    bound = 2 * MEMORY_MB if box.bounds_job_memory else 4 * MEMORY_MB
    outcome, drop = measured_twice_if_over(lambda: box.evaluate(problem, MANY_PROCESSES), bound)
    if box.bounds_job_memory:  # together past the limit: `memory`, though the job's first process replied
        assert outcome.error_kind == ErrorKind.MEMORY and outcome.scores == FAILED, (outcome.error, outcome.stderr)
        assert drop["mb"] < 2 * MEMORY_MB, drop
    else:  # the fallback's promise: each process within RLIMIT_AS; the one past it refused (MemoryError)
        assert outcome.scores == {"c0": 0.0, "c1": 0.0}, outcome.case_errors
        assert drop["mb"] < 4 * MEMORY_MB, drop
    assert_known(box, problem)


def test_python_numpy_and_multiprocessing_still_run_in_the_jail(box, problem):
    outcome = box.evaluate(problem, STILL_WORKS)
    assert outcome.scores == {"c0": 0.0, "c1": 0.0}, (outcome.case_errors, outcome.error, outcome.stderr[-500:])


def test_memfds_are_refused_outside_the_jail_too(problem):
    """Without bubblewrap the candidate's process installs the same seccomp filter itself before exec."""
    box = weak_sandbox_or_skip(slots=1)
    try:
        outcome, drop = measured_twice_if_over(lambda: box.evaluate(problem, MEMFD_HOG), 2 * MEMORY_MB)
        assert outcome.error_kind == ErrorKind.CRASH and "Operation not permitted" in (outcome.error or ""), outcome
        assert outcome.scores == FAILED
        assert drop["mb"] < 2 * MEMORY_MB, drop
        assert_known(box, problem)
    finally:
        box.close()


def test_cgroups_of_dead_engines_are_removed_at_start_and_ours_at_close():
    if os.geteuid() != 0:
        pytest.skip("memory cgroups need root here")
    parent = find_parent()[0]
    if parent is None:
        missing("memory cgroup", find_parent()[2])
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale, live = parent / f"{PREFIX}{dead.pid}-7", parent / f"{PREFIX}{os.getppid()}-7"
    stale.mkdir()
    live.mkdir(exist_ok=True)
    try:
        box = ProcessSandbox(slots=1)
        ours = box.cgroup_paths
        assert ours and not stale.exists() and live.exists() and all(p.exists() for p in ours)
        box.close()
        assert box.cgroup_paths == () and not any(p.exists() for p in ours)
    finally:
        for path in (stale, live):
            with contextlib.suppress(FileNotFoundError):
                path.rmdir()


def test_two_sandboxes_in_one_process_keep_their_own_cgroups(problem):
    """Lanes are numbered from 0 in every sandbox: named by pid and lane alone, a second sandbox of the same
    process shared the first one's groups, and closing it removed them under the first one, whose next job was
    refused (`cannot set up the memory cgroup .../cgroup.procs`)."""
    first = _box("cgroup")
    try:
        second = _box("cgroup")
        assert not set(first.cgroup_paths) & set(second.cgroup_paths)
        second.close()
        assert all(path.is_dir() for path in first.cgroup_paths)
        assert_known(first, problem)
    finally:
        first.close()
