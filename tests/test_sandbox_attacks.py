"""An attacker's candidates against both backends: forged answers, stolen secrets, lingering and meddling processes.

After every attack, known programs are scored and their exact vectors asserted: containment means the next
answers are right, not merely that the attack ended in some error. CI runs this file as root and, through
setpriv, as an unprivileged user.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from evolve.problem import load_problem
from evolve.problem.outcome import ErrorKind
from sandboxes.process import ProcessSandbox
from sandboxes.sandbox import SandboxRefused
from tests.helpers import (
    KNOWN,
    assert_known_vectors,
    hiding_sandbox,
    host_binds_seen_from_venv,
    reported,
    write_problem,
)
from tests.services import left_to_the_unprivileged_pass

TIMEOUT = 3.0


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(write_problem(tmp_path_factory.mktemp("attacked"), timeout=TIMEOUT))


@pytest.fixture(scope="module", params=["process", "docker"])
def sandbox(request):
    box = hiding_sandbox(request.param, 2)
    yield box
    box.close()


def test_forged_reply_lines_on_every_descriptor(sandbox, problem):
    forged = (
        '{"reply": {"outputs": {"c0": {"ok": 4}, "c1": {"ok": 9}}}, "status": "exit 0", "stdout": "",'
        ' "stderr": "", "nonce": null}\n{"outputs": {"c0": {"ok": 4}, "c1": {"ok": 9}}}\n'
    )
    code = (
        "import os\ndef solve(x):\n    for fd in range(3, 1024):\n        try:\n"
        f"            os.write(fd, {forged.encode()!r})\n        except OSError:\n            pass\n"
        "    os._exit(0)\n"
    )
    assert sandbox.evaluate(problem, KNOWN[0][0]).scores == KNOWN[0][1]
    outcome = sandbox.evaluate(problem, code)
    assert outcome.error_kind == ErrorKind.BAD_OUTPUT, outcome.error
    assert outcome.scores == {"c0": 0.0, "c1": 0.0}
    assert_known_vectors(sandbox, problem)


def test_the_candidate_holds_only_stdio_and_its_reply_pipe(sandbox, problem):
    code = "import os\ndef solve(x):\n    return sorted(int(fd) for fd in os.listdir('/proc/self/fd'))\n"
    fds = reported(sandbox.evaluate(problem, code))
    assert fds[:3] == [0, 1, 2]
    assert len(fds) <= 5, fds  # stdio, the reply pipe, and the descriptor listdir itself opened
    assert_known_vectors(sandbox, problem)


@pytest.fixture
def secrets_on_host(problem, tmp_path):
    """A home-directory file, an archive and the problem's evaluator, each readable on the host."""
    home = Path.home() / f".evolve-attack-{uuid.uuid4().hex[:8]}"
    home.write_text("home-secret-4471")
    archive = tmp_path / "runs" / "t.db"
    archive.parent.mkdir()
    with sqlite3.connect(archive) as db:
        db.execute("create table programs (code text)")
        db.execute("insert into programs values ('archive-secret-9932')")
    yield {"home": home, "archive": archive, "evaluator": problem.evaluator_path}
    home.unlink()


def test_expected_answers_archive_and_home_are_out_of_reach(sandbox, problem, secrets_on_host):
    paths = {name: str(path) for name, path in secrets_on_host.items()}
    code = (
        "import os\ndef solve(x):\n    got = {}\n"
        f"    for name, path in {paths!r}.items():\n        try:\n"
        "            got[name] = open(path, 'rb').read()[:4000].decode(errors='replace')\n"
        "        except OSError as e:\n            got[name] = type(e).__name__\n"
        f"    try:\n        got['home_dir'] = os.listdir({str(Path.home())!r})\n"
        "    except OSError as e:\n        got['home_dir'] = type(e).__name__\n    return got\n"
    )
    got = reported(sandbox.evaluate(problem, code))
    # Not there at all: a PermissionError would come from uid separation alone (as root the slot's uid cannot cross
    # /root or pytest's 0700 folders), which a mount view that let the host's files in would still give.
    assert {name: got[name] for name in paths} == dict.fromkeys(paths, "FileNotFoundError"), got
    assert secrets_on_host["home"].name not in str(got["home_dir"])
    # The attack as it was found: import the evaluator by absolute path and answer from its table.
    cheat = (
        "import importlib.util\ndef solve(x):\n"
        f"    spec = importlib.util.spec_from_file_location('ev', {paths['evaluator']!r})\n"
        "    ev = importlib.util.module_from_spec(spec)\n    spec.loader.exec_module(ev)\n"
        "    return next(c['expected'] for c in ev.cases() if c['input'] == x)\n"
    )
    outcome = sandbox.evaluate(problem, cheat)
    assert outcome.scores == {"c0": 0.0, "c1": 0.0} and outcome.error_kind == ErrorKind.CRASH
    assert_known_vectors(sandbox, problem)


def test_the_hosts_local_configuration_under_usr_is_out_of_reach(sandbox, problem):
    """/usr comes in whole, but not /usr/local/etc, where a host keeps pip.conf or an npmrc with a token: a
    candidate (or a compiler's #include, whose error quotes the file) finds an empty folder there."""
    etc = Path("/usr/local/etc")
    planted = etc / f"evolve-attack-{uuid.uuid4().hex[:8]}"
    if os.access(etc, os.W_OK):  # as root; the unprivileged pass checks what the host already keeps there
        planted.write_text("usr-local-secret-5120")
    code = (
        "import os\ndef solve(x):\n    got = {}\n    try:\n        got['listed'] = os.listdir('/usr/local/etc')\n"
        "    except OSError as e:\n        got['listed'] = type(e).__name__\n    try:\n"
        f"        got['read'] = open({str(planted)!r}).read()\n"
        "    except OSError as e:\n        got['read'] = type(e).__name__\n    return got\n"
    )
    try:
        got = reported(sandbox.evaluate(problem, code))
    finally:
        planted.unlink(missing_ok=True)
    assert got["listed"] in ([], "FileNotFoundError"), got
    assert got["read"] == "FileNotFoundError", got
    assert_known_vectors(sandbox, problem)


def test_other_processes_environment_and_command_lines_are_hidden(sandbox, problem, monkeypatch):
    """A secret in the engine's environment and in another host process's environment and command line.

    The candidate reads every /proc/PID/{cmdline,environ} it can (its parent's first) and searches them itself;
    it answers in numbers, not in a feedback that is cut short: c0 right means the secret was found nowhere,
    c1 right means the scan read at least its own command line (it really looked)."""
    marker = f"engine-secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("EVOLVE_ENGINE_SECRET", marker)  # the engine here is this process (in-process sandboxes)
    host = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", marker], env={**os.environ, "SECRET": marker}
    )
    half = len(marker) // 2
    try:
        code = (
            "import os\ndef solve(x):\n"
            f"    marker = ({marker[:half]!r} + {marker[half:]!r}).encode()\n"
            "    found, read_own = False, False\n"
            "    paths = [f'/proc/{os.getppid()}/environ'] + [f'/proc/{p}/{f}' for p in os.listdir('/proc')"
            " if p.isdigit() for f in ('cmdline', 'environ')]\n"
            "    for path in paths:\n        try:\n            data = open(path, 'rb').read()\n"
            "        except OSError:\n            continue\n"
            "        found = found or marker in data\n"
            "        read_own = read_own or (path == f'/proc/{os.getpid()}/cmdline' and len(data) > 0)\n"
            "    if x == 2:\n        return -1 if found else 4\n"
            "    return 9 if read_own else -1\n"
        )
        outcome = sandbox.evaluate(problem, code)
        assert outcome.scores == {"c0": 1.0, "c1": 1.0}, (outcome.error, outcome.feedback)
    finally:
        host.kill()
        host.wait()
    assert_known_vectors(sandbox, problem)


def test_the_mount_view_cannot_be_escaped(sandbox, problem):
    """Through /proc's root links, '..' past the root, or a user namespace of its own in which it unmounts."""
    target = str(problem.evaluator_path)
    code = (
        "import ctypes, os\ndef solve(x):\n    libc = ctypes.CDLL(None, use_errno=True)\n    found = []\n"
        f"    target = {target!r}\n"
        "    def look(tag):\n"
        "        for path in (target, '/proc/1/root' + target, '/proc/self/root/../../..' + target):\n"
        "            try:\n                open(path).read()\n                found.append(tag + ':' + path)\n"
        "            except OSError:\n                pass\n    look('plain')\n"
        "    try:\n        os.chroot('/tmp')\n        os.chdir('../../..')\n        look('chroot')\n"
        "    except OSError:\n        pass\n"
        "    if libc.unshare(0x10000000 | 0x00020000) == 0:\n"
        "        libc.mount(b'none', b'/', None, 0x4000 | 0x40000, None)\n"
        "        for m in (b'/work', b'/usr', b'/tmp', b'/'):\n            libc.umount2(m, 2)\n"
        "        look('userns')\n    return found\n"
    )
    got = reported(sandbox.evaluate(problem, code))
    assert got == [], got
    assert_known_vectors(sandbox, problem)


def test_the_problem_folder_cannot_be_written(sandbox, problem):
    evaluator = problem.evaluator_path
    before = evaluator.read_bytes()
    dropped = problem.root / "dropped.py"
    code = (
        "def solve(x):\n    out = []\n"
        f"    for path, mode in (({str(evaluator)!r}, 'a'), ({str(dropped)!r}, 'w')):\n"
        "        try:\n            open(path, mode).write('\\nimport os; os.system(\"id\")\\n')\n"
        "            out.append('written')\n        except OSError as e:\n            out.append(type(e).__name__)\n"
        "    return out\n"
    )
    got = reported(sandbox.evaluate(problem, code))
    assert "written" not in got, got
    assert evaluator.read_bytes() == before and not dropped.exists()
    assert_known_vectors(sandbox, problem)


def test_other_slots_can_be_neither_signalled_nor_traced(sandbox, problem):
    """An attacker tries, for a second, to ptrace and SIGKILL every process it can see, while a victim runs in
    another slot (the test waits until the victim has named itself, so the two surely overlap)."""
    name = f"victim-{uuid.uuid4().hex[:8]}"
    victim_code = (
        "import ctypes, time\ndef solve(x):\n"
        f"    ctypes.CDLL(None).prctl(15, {name.encode()!r}, 0, 0, 0)\n"
        "    time.sleep(1.0)\n    return x * x\n"
    )
    attacker = (
        "import ctypes, os, signal, time\ndef solve(x):\n    libc = ctypes.CDLL(None, use_errno=True)\n"
        "    hits = set()\n    end = time.time() + 1.0\n    while time.time() < end:\n"
        "        for p in os.listdir('/proc'):\n            if not p.isdigit() or int(p) in (os.getpid(), 1):\n"
        "                continue\n            if libc.ptrace(16, int(p), 0, 0) == 0:\n"
        "                hits.add('traced')\n            try:\n                os.kill(int(p), signal.SIGKILL)\n"
        "                hits.add('killed')\n            except OSError:\n                pass\n"
        "        time.sleep(0.01)\n    return sorted(hits)\n"
    )
    results: dict[str, object] = {}

    def victim() -> None:
        results["victim"] = sandbox.evaluate(problem, victim_code)

    thread = threading.Thread(target=victim)
    thread.start()
    deadline = time.monotonic() + 30
    while not _named(name) and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _named(name), "the victim never ran"
    attack = sandbox.evaluate(problem, attacker)
    thread.join()
    assert results["victim"].scores == {"c0": 1.0, "c1": 1.0}, results["victim"].error
    assert attack.ok and reported(attack) == [], attack.feedback
    assert_known_vectors(sandbox, problem)


def _named(name: str) -> bool:
    """A live process named `name` (its /proc/PID/comm) exists."""
    return any(_read(p / "comm").strip() == name.encode() for p in Path("/proc").iterdir() if p.name.isdigit())


def test_a_lingering_process_cannot_read_or_change_the_next_job(sandbox, problem):
    marker = f"linger-{uuid.uuid4().hex[:8]}"
    code = (
        "import glob, os, sys, time\ndef solve(x):\n    if os.fork() == 0:\n        os.setsid()\n"
        f"        sys.argv[:] = [{marker!r}]\n        end = time.time() + 6\n        while time.time() < end:\n"
        "            for f in glob.glob('/work/*.py') + glob.glob('/tmp/evolve-eval-*/*.py'):\n"
        "                try:\n                    open(f, 'w').write('def solve(x):\\n    return -7\\n')\n"
        "                except OSError:\n                    pass\n            time.sleep(0.001)\n"
        "        os._exit(0)\n    return x * x\n"
    )
    assert sandbox.evaluate(problem, code).scores == {"c0": 1.0, "c1": 1.0}
    for _ in range(2):
        assert_known_vectors(sandbox, problem)
    time.sleep(0.2)
    assert not any(marker.encode() in _read(p / "cmdline") for p in Path("/proc").iterdir() if p.name.isdigit())


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


# Scans the candidate's own memory (every string the garbage collector can reach, then every readable mapping
# through /proc/self/mem) for any marker an earlier job carried, and every other process's memory it can open
# (the runner's and the zygote's, were they readable). Its own code holds only the pattern, which cannot match
# itself ('[' is no hex digit), so any hit came from another job.
MEMORY_SEARCH = """
import ctypes, gc, os, re
PATTERN = re.compile(b'zygote-leak-' + b'[0-9a-f]{32}')
TEXT = re.compile('zygote-leak-' + '[0-9a-f]{32}')

def _hit(value):
    if isinstance(value, str):
        return TEXT.search(value) is not None
    return isinstance(value, (bytes, bytearray)) and PATTERN.search(value) is not None

def _scan(pid, found, tag):
    scanned = 0
    try:
        with open(f'/proc/{pid}/maps') as maps, open(f'/proc/{pid}/mem', 'rb', 0) as mem:
            for line in maps.read().splitlines():
                span, perms = line.split()[:2]
                start, end = (int(a, 16) for a in span.split('-'))
                if perms[0] != 'r':
                    continue
                for pos in range(start, end, 1 << 20):
                    try:
                        mem.seek(pos)
                        chunk = mem.read(min(1 << 20, end - pos) + 44)
                    except (OSError, OverflowError, ValueError):
                        break
                    scanned += len(chunk)
                    if PATTERN.search(chunk):
                        found.add(tag)
    except OSError:
        pass
    return scanned

def solve(x):
    found = set()
    for obj in gc.get_objects():
        try:
            items = [*obj.keys(), *obj.values()] if isinstance(obj, dict) else obj
            if isinstance(items, (list, tuple, set, frozenset)) and any(_hit(v) for v in items):
                found.add('gc')
        except Exception:
            pass
    ctypes.CDLL(None).prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: /proc/self/mem is ours again after setuid
    scanned = _scan('self', found, 'mem')
    for pid in os.listdir('/proc'):
        if pid.isdigit() and int(pid) != os.getpid():
            _scan(pid, found, 'mem of another process')
    return [scanned > 4 << 20, sorted(found)]  # a real scan of its own memory reads megabytes
"""


def test_a_candidate_finds_no_earlier_job_in_its_own_memory(sandbox, problem):
    """Earlier candidates' code, output and replies never enter a later candidate's address space (fork mode
    forks candidates from a zygote that never held a job)."""
    marker = f"zygote-leak-{uuid.uuid4().hex}"
    planted = (
        f"import sys\nSECRET = {marker!r}\ndef solve(x):\n    print(SECRET)\n"
        f"    print(SECRET, file=sys.stderr)\n    return x * x  # {marker}\n"
    )
    for _ in range(3):  # every warm container of the pool gets the marker (they are taken in turn)
        outcome = sandbox.evaluate(problem, planted)
        assert outcome.scores == {"c0": 1.0, "c1": 1.0} and marker in outcome.stdout, outcome.error
    for _ in range(3):
        outcome = sandbox.evaluate(problem, MEMORY_SEARCH)
        assert reported(outcome) == [True, []], outcome.feedback
    assert_known_vectors(sandbox, problem)


def test_without_bubblewrap_the_process_sandbox_says_weak_and_run_refuses_split_problems(problem, tmp_path):
    try:
        box = ProcessSandbox(slots=1, jail=False)
    except SandboxRefused as exc:  # root whose interpreter other uids cannot reach: it never runs them as root
        assert os.geteuid() == 0 and "as root" in str(exc), exc
        box = None
    if box is not None:
        try:
            assert not box.hides_files and "WEAK" in box.isolation()
        finally:
            box.close()
    from tests.helpers import evolve_run_cmd

    command = [a for a in evolve_run_cmd(problem.root, tmp_path / "a.db", "replay:/nonexistent", 4) if "weak" not in a]
    env = {**os.environ, "PATH": str(tmp_path)}  # no bwrap to be found
    out = subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    allowed = subprocess.run([*command, "--allow-weak-sandbox"], capture_output=True, text=True, timeout=120, env=env)
    if box is None:
        assert "as root" in out.stderr and allowed.returncode == 2 and "as root" in allowed.stderr, allowed.stderr
        left_to_the_unprivileged_pass("as root the WEAK sandbox refuses before the split-problem rule is asked")
    assert "WEAK" in out.stderr and "--allow-weak-sandbox" in out.stderr
    assert "WEAK" not in allowed.stderr and "replay" in allowed.stderr  # past the check, stopped by the policy


def test_a_python_in_a_scratch_folder_is_bound_where_no_runner_wipes(tmp_path):
    """A virtual environment under /tmp still puts the container's interpreter at /opt/python, never in scratch."""
    venv = tmp_path / "venv"
    python, binds = host_binds_seen_from_venv(venv)
    scratch = ("/work", "/tmp", "/dev/shm")
    assert python.startswith(("/opt/python/", "/usr/")), python
    assert not any(inside == s or inside.startswith(s + "/") for inside in binds.values() for s in scratch)
    assert str(venv) not in binds
