"""Docker: nothing a job leaves behind reaches the next job, whatever it forks, clones or hands to the zygote.

Each attack is followed by programs with distinct known vectors, scored one after another several times: a
survivor that rewrote a later program, or a pid table left full, shows as a wrong vector, not just an error.
The candidate uid is the one the sandbox under test runs candidates as (asked of a candidate), never assumed.
"""

from __future__ import annotations

import errno
import struct

import pytest

from evolve.problem import load_problem
from sandboxes.docker_pool import OWNER
from tests.helpers import SPLIT_TOML, docker_sandbox_or_skip, reported, write_problem

pytestmark = pytest.mark.docker
TIMEOUT = 3.0
KNOWN = [
    ("def solve(x):\n    return x * x\n", {"c0": 1.0, "c1": 1.0}),
    ("def solve(x):\n    return 4\n", {"c0": 1.0, "c1": 0.0}),
    ("def solve(x):\n    return 9\n", {"c0": 0.0, "c1": 1.0}),
    ("def solve(x):\n    return -1\n", {"c0": 0.0, "c1": 0.0}),
]
# The same programs, each of which first forks a child and waits for it (an honest program that forks).
FORKING = (
    "import os\ndef solve(x):\n    pid = os.fork()\n    if pid == 0:\n        os._exit(0)\n    os.waitpid(pid, 0)\n"
)
KNOWN_FORKING = [(FORKING + code.split("\n", 1)[1], want) for code, want in KNOWN]


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(write_problem(tmp_path_factory.mktemp("leftovers"), timeout=TIMEOUT))


@pytest.fixture(scope="module")
def roomy_problem(tmp_path_factory):
    """The same problem with room for 512 processes, as a problem that forks a lot would have."""
    toml = SPLIT_TOML.format(name="roomy", timeout=TIMEOUT).replace("max_processes = 32", "max_processes = 512")
    problem = load_problem(write_problem(tmp_path_factory.mktemp("roomy"), toml=toml))
    assert problem.config.limits.max_processes == 512
    return problem


@pytest.fixture
def sandbox():
    """One warm container (workers=1): the job after an attack runs where the attack ran."""
    box = docker_sandbox_or_skip(workers=1)
    yield box
    box.close()


def assert_known_vectors(sandbox, problem, known=KNOWN, rounds: int = 3) -> None:
    """Each known program, one after another and `rounds` times over, gets exactly its own vector."""
    for _ in range(rounds):
        got = [sandbox.evaluate(problem, code).scores for code, _ in known]
        assert got == [want for _, want in known]


def ours(sandbox) -> list[str]:
    """The ids of this engine's sandbox containers."""
    found = sandbox.client.containers.list(filters={"label": f"vpo-evolve.owner={OWNER}"}, ignore_removed=True)
    return [c.id for c in found]


# Lists the processes of the candidate's own uid other than itself (zombies included).
PEERS = """import os
def solve(x):
    me, peers = os.getpid(), []
    for p in os.listdir('/proc'):
        if p.isdigit() and int(p) != me:
            try:
                if os.stat(f'/proc/{p}').st_uid == os.getuid():
                    peers.append(p)
            except OSError:
                pass
    return [os.getuid(), peers]
"""


def candidate_uid_and_peers(sandbox, problem) -> tuple[int, list[str]]:
    got = reported(sandbox.evaluate(problem, PEERS))
    assert isinstance(got, list), f"the probe did not run as written; it answered {got!r}"
    return got[0], got[1]


# x86-64 machine code, run from an anonymous executable mapping (the scratch mounts are noexec):
#   hop:    clone(CLONE_VM | SIGCHLD, stack 0)   the child goes on, the parent exits: a new pid every hop
#           (when clone fails, e.g. the pids limit is spent, the same process goes on)
#           fd = open(tmp, O_WRONLY|O_CREAT|O_TRUNC, 0644); write(fd, body, bodylen); close(fd)
#           rename(tmp, target)
#           nanosleep(pause)
#           jmp hop
# followed by pause (struct timespec), bodylen (u32), tmp (64 bytes), target (64 bytes), body.
HOP_CODE = (
    "b838000000bf1101000031f631d24531d24531c00f0585c0740b7809b83c00000031ff0f05b802000000488d3d73000000be41"
    "020000baa40100000f0585c0783689c389c7b801000000488d35d30000008b15490000000f05b80300000089df0f05b85200"
    "0000488d3d36000000488d356f0000000f05b823000000488d3d0d00000031f60f05e974ffffff0f1f4000"
)
assert len(HOP_CODE) == 2 * 0x90


def hop_chain_candidate(target: str, body: str, pause_ns: int, zombies: int) -> str:
    """A candidate that answers correctly, after leaving behind a chain of processes that clones a successor
    and exits every few microseconds, and between hops renames its own file over `target`.

    First it hands `zombies` children to its parent (clone(CLONE_PARENT), each exits at once): a kill that
    scans /proc inspects each of them before it reaches the chain's newer pid, which has moved on by then."""
    blob = (
        bytes.fromhex(HOP_CODE)
        + struct.pack("<qqI", 0, pause_ns, len(body.encode()))
        + b"/work/.hop".ljust(64, b"\0")
        + target.encode().ljust(64, b"\0")
        + body.encode()
    )
    return (
        "import ctypes, mmap, os, time\nSTARTED = []\n"
        "def solve(x):\n"
        "    if not STARTED:\n"
        "        STARTED.append(1)\n"
        "        libc = ctypes.CDLL(None)\n"
        f"        for _ in range({zombies}):\n"
        "            if libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0) == 0:  # clone(CLONE_PARENT | SIGCHLD)\n"
        "                os._exit(0)\n"
        "        if os.fork() == 0:\n"
        "            page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)\n"
        f"            page.write({blob!r})\n"
        "            ctypes.CFUNCTYPE(None)(ctypes.addressof(ctypes.c_char.from_buffer(page)))()\n"
        "            os._exit(0)\n"
        "        for _ in range(1000):  # answer once the chain runs: it has made its file\n"
        "            if os.path.exists('/work/.hop'):\n"
        "                break\n"
        "            time.sleep(0.001)\n"
        "    return x * x\n"
    )


def test_a_clone_chain_that_outruns_a_scan_is_killed_before_the_next_job(sandbox, roomy_problem):
    """The red-team attack: a survivor renamed its own file over the next job's program (-7 scores 0, 0).

    Against a kill that lists /proc and kills what it finds, with 300 zombies for that scan to inspect first,
    the chain lived on after most attacks; the kill as the candidate uid leaves it no way out."""
    problem = roomy_problem
    attack = hop_chain_candidate(f"/work/{problem.config.program.file}", "def solve(x):\n    return -7\n", 0, 300)
    assert_known_vectors(sandbox, problem, rounds=1)
    (container,) = ours(sandbox)
    for _ in range(4):
        assert sandbox.evaluate(problem, attack).scores == {"c0": 1.0, "c1": 1.0}
        assert_known_vectors(sandbox, problem, rounds=1)
        uid, peers = candidate_uid_and_peers(sandbox, problem)
        assert peers == [], f"processes of uid {uid} outlived their job: {peers}"
    assert ours(sandbox) == [container], "the kill failed and the container had to be replaced"


# Leaves processes that, once the candidate has exited, SIGKILL everything they may signal and fork more of
# themselves: whatever kills them must be out of their reach and need no free pid.
SPAMMER = """import os, signal
STARTED = []
def solve(x):
    if not STARTED:
        STARTED.append(1)
        parent = os.getpid()
        if os.fork() == 0:
            while os.getppid() == parent:
                pass
            while True:
                try:
                    os.kill(-1, signal.SIGKILL)
                    os.fork()
                except OSError:
                    pass
    return x * x
"""


def test_leftovers_that_kill_and_fork_cannot_stop_their_killer(sandbox, problem):
    """Guards the kill itself: a killer they could signal dies first, and the container is then replaced."""
    assert_known_vectors(sandbox, problem, rounds=1)
    (container,) = ours(sandbox)
    for _ in range(3):
        assert sandbox.evaluate(problem, SPAMMER).scores == {"c0": 1.0, "c1": 1.0}
        assert candidate_uid_and_peers(sandbox, problem)[1] == []
        assert_known_vectors(sandbox, problem, KNOWN_FORKING, rounds=1)
    assert ours(sandbox) == [container], "the kill failed and the container had to be replaced"


# Makes children with clone(CLONE_PARENT): their parent is the candidate's parent, not the candidate.
CLONE_PARENT_CHILDREN = """import ctypes, os
def solve(x):
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(60):  # more than the container's pids limit (48) holds, over both cases
        if libc.syscall(56, 0x8000 | 17, 0, 0, 0, 0) == 0:  # clone(CLONE_PARENT | SIGCHLD)
            os._exit(0)
    return x * x
"""


def test_children_handed_to_the_zygote_are_reaped(sandbox, problem):
    """60 such zombies once spent the container's pids limit: every later program that forked then failed."""
    assert_known_vectors(sandbox, problem, KNOWN_FORKING, rounds=1)
    (container,) = ours(sandbox)
    for _ in range(3):
        assert sandbox.evaluate(problem, CLONE_PARENT_CHILDREN).scores == {"c0": 1.0, "c1": 1.0}
        assert_known_vectors(sandbox, problem, KNOWN_FORKING, rounds=1)
        assert candidate_uid_and_peers(sandbox, problem)[1] == []
    assert ours(sandbox) == [container], "the container had to be replaced"


# Tries to change, replace or remove its own program (the next job's files are made the same way), and to
# make its own files where candidates may.
TAMPER = """import os
def solve(x):
    me = os.path.abspath(__file__)
    got = {}
    def attempt(name, action):
        try:
            action()
            got[name] = 'done'
        except OSError as e:
            got[name] = type(e).__name__
    attempt('write', lambda: open(me, 'a').write('# changed'))
    attempt('chmod', lambda: os.chmod(me, 0o666))
    open('/work/mine.py', 'w').write('def solve(x):\\n    return -7\\n')
    attempt('rename over', lambda: os.rename('/work/mine.py', me))
    attempt('unlink', lambda: os.unlink(me))
    attempt('chmod dir', lambda: os.chmod('/work', 0o777))
    for where in ('/work', os.environ['HOME'], '/tmp', '/dev/shm', os.getcwd()):
        attempt(f'create in {where}', lambda: open(os.path.join(where, f'own{x}'), 'w').write('ok'))
    try:
        st = os.stat(me)
        got['program'] = [st.st_uid == os.getuid(), oct(st.st_mode & 0o7777)]
    except OSError as e:
        got['program'] = type(e).__name__
    got['work'] = oct(os.stat('/work').st_mode & 0o7777)
    return got
"""


def test_a_candidate_can_change_none_of_its_job_files(sandbox, problem):
    got = reported(sandbox.evaluate(problem, TAMPER))
    assert {k: v for k, v in got.items() if not k.startswith("create")} == {
        "write": "PermissionError",
        "chmod": "PermissionError",
        "rename over": "PermissionError",
        "unlink": "PermissionError",
        "chmod dir": "PermissionError",
        "program": [False, "0o444"],
        "work": "0o1777",
    }
    assert {k: v for k, v in got.items() if k.startswith("create")} == {
        f"create in {where}": "done" for where in ("/work", "/tmp", "/dev/shm")
    }, got
    assert_known_vectors(sandbox, problem, rounds=1)


# Asks the kernel for a user namespace three ways; each errno, or "created" (the child exits at once).
USERNS = """import ctypes, os
def solve(x):
    libc = ctypes.CDLL(None, use_errno=True)
    CLONE_NEWUSER = 0x10000000
    got = {}
    def record(name, result):
        if result == 0 and name == 'clone':
            os._exit(0)
        got[name] = 'created' if result >= 0 else ctypes.get_errno()
    record('unshare', libc.unshare(CLONE_NEWUSER))
    record('clone', libc.syscall(56, CLONE_NEWUSER | 17, 0, 0, 0, 0))
    args = (ctypes.c_uint64 * 11)(CLONE_NEWUSER, 0, 0, 0, 17)  # struct clone_args: flags .. exit_signal
    pid = libc.syscall(435, args, 88)  # clone3
    if pid == 0:
        os._exit(0)
    got['clone3'] = 'created' if pid > 0 else ctypes.get_errno()
    return got
"""


def test_user_namespaces_are_refused_to_candidates(sandbox, problem):
    """Docker's default seccomp profile refuses them without CAP_SYS_ADMIN: clone3 as unimplemented, so that
    the C library falls back to clone, whose namespace flags it refuses like unshare's."""
    got = reported(sandbox.evaluate(problem, USERNS))
    assert got == {
        "unshare": errno.EPERM,
        "clone": errno.EPERM,
        "clone3": errno.ENOSYS,
    }
    assert_known_vectors(sandbox, problem, rounds=1)


def test_a_scratch_tree_thousands_of_levels_deep_costs_its_container_not_its_score(sandbox, problem):
    """Found by a red-team pass: the runner's wipe recursed once per level, a tree 5,000 deep in /tmp raised
    RecursionError out of it, and the candidate's honest answer became a crash (`no reply`), run again in a new
    container. The answer stands now; what the wipe left goes with the container."""
    deep = (
        "import os\ndef solve(x):\n    fd, name = os.open('/tmp', os.O_RDONLY), f'case{x}'\n    for _ in range(5000):\n"
        "        os.mkdir(name, dir_fd=fd)\n        nxt = os.open(name, os.O_RDONLY, dir_fd=fd)\n"
        "        name = 'd'\n"
        "        os.close(fd)\n        fd = nxt\n    return x * x\n"
    )
    outcome = sandbox.evaluate(problem, deep)
    assert (outcome.error, outcome.scores) == (None, {"c0": 1.0, "c1": 1.0})
    assert_known_vectors(sandbox, problem)
