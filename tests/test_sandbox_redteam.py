"""The red team's findings, replayed: failures that outscored honest answers, replies that escaped evaluate().

Each attack is followed by known programs whose exact vectors are asserted, so containment means the next
answers are right, not merely that the attack ended in some error.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from evolve.problem import ProblemError, load_problem
from evolve.problem.config import FitnessSection
from evolve.problem.outcome import ErrorKind
from sandboxes.jail import find_jail
from sandboxes.process import ProcessSandbox
from tests.helpers import docker_sandbox_or_skip, weak_sandbox_or_skip
from tests.services import missing

MIN_TOML = """
name = "min"
description = "Square the input; the score is the error, lower is better."
[program]
file = "seed.py"
[fitness]
components = [{{ name = "c0", direction = "minimize"{extra} }}, {{ name = "c1", direction = "minimize"{extra} }}]
[limits]
timeout_s = 3
memory_mb = 512
"""
MIN_EVAL = """
def cases():
    return [{"name": f"c{i}", "input": i + 2, "expected": (i + 2) ** 2} for i in range(2)]

def score(case, output):
    return abs(float(output) - case["expected"])
"""
SEED = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return x\n# EVOLVE-BLOCK-END\n"
MIN_KNOWN = [
    ("def solve(x):\n    return x * x\n", {"c0": 0.0, "c1": 0.0}),
    ("def solve(x):\n    return x\n", {"c0": 2.0, "c1": 6.0}),
]

SIMPLE_TOML = """
name = "simple"
description = "Square the input."
[program]
file = "seed.py"
[fitness]
components = [{ name = "exact", bounds = [0.0, 1.0] }, { name = "close", bounds = [0.0, 1.0] }]
[limits]
timeout_s = 3
memory_mb = 512
"""
SIMPLE_EVAL = """
import importlib.util

def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("candidate", program_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if hasattr(module, "forged"):
        return module.forged()
    exact = sum(module.solve(x) == x * x for x in range(4))
    close = sum(abs(module.solve(x) - x * x) <= 2 for x in range(4))
    return {"exact": exact / 4, "close": close / 4}
"""
SIMPLE_KNOWN = [
    ("def solve(x):\n    return x * x\n", {"exact": 1.0, "close": 1.0}),
    ("def solve(x):\n    return x * x + 1\n", {"exact": 0.0, "close": 1.0}),
    ("def solve(x):\n    return 100\n", {"exact": 0.0, "close": 0.0}),
]


def folder(root, toml: str, evaluate: str):
    root.mkdir(parents=True, exist_ok=True)
    (root / "problem.toml").write_text(toml)
    (root / "seed.py").write_text(SEED)
    (root / "evaluate.py").write_text(textwrap.dedent(evaluate))
    return root


@pytest.fixture(scope="module")
def process_box():
    jail, why = find_jail()
    if jail is None:
        missing("bubblewrap", why)
    box = ProcessSandbox(slots=1)
    yield box
    box.close()


def assert_vectors(box, problem, known) -> None:
    assert [box.evaluate(problem, code).scores for code, _ in known] == [want for _, want in known]


def test_an_unbounded_component_without_fail_value_is_refused_at_load(tmp_path):
    with pytest.raises(ProblemError) as err:
        load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=""), MIN_EVAL))
    assert "neither bounds nor fail_value" in str(err.value) and "'c0'" in str(err.value)
    cases = SIMPLE_TOML.replace(
        'components = [{ name = "exact", bounds = [0.0, 1.0] }, { name = "close", bounds = [0.0, 1.0] }]', "cases = 2"
    )
    with pytest.raises(ProblemError, match="cases needs bounds"):
        load_problem(folder(tmp_path / "q", cases, MIN_EVAL))
    # Configs stored by runs made before the rule still read back (inspect, report, train on old archives).
    stored = FitnessSection.model_validate({"components": [{"name": "loss", "direction": "minimize"}]})
    assert [c.failure for c in stored.resolved()] == [0.0]


@pytest.mark.parametrize(
    "answer",
    ["float('nan')", "None", "'garbage'", "10 ** 400", "float('inf')"],
)
def test_a_failing_answer_never_beats_an_honest_minimum(tmp_path, process_box, answer):
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    outcome = process_box.evaluate(problem, f"def solve(x):\n    return {answer}\n")
    assert outcome.scores == {"c0": 1e6, "c1": 1e6}
    assert outcome.error_kind == ErrorKind.CRASH and set(outcome.case_errors) == {"c0", "c1"}
    raising = process_box.evaluate(problem, "def solve(x):\n    raise ValueError('no')\n")
    assert raising.scores == {"c0": 1e6, "c1": 1e6}
    assert_vectors(process_box, problem, MIN_KNOWN)


def test_a_nan_on_one_case_is_that_case_s_error_not_an_honest_score(tmp_path, process_box):
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    outcome = process_box.evaluate(problem, "def solve(x):\n    return x * x if x == 2 else float('nan')\n")
    assert outcome.scores == {"c0": 0.0, "c1": 1e6}
    assert outcome.error_kind is None and list(outcome.case_errors) == ["c1"]
    assert_vectors(process_box, problem, MIN_KNOWN)


@pytest.mark.parametrize(
    ("forged", "error"),
    [
        ("{'exact': 10 ** 400, 'close': 1.0}", "crash"),
        ("REPLY", "too large for a float"),
        ('{"exact": 5.0, "close": 1.0}', "outside their bounds"),
        ('{"exact": 1.0, "close": -0.5}', "outside their bounds"),
    ],
)
def test_simple_form_overflow_and_out_of_bounds_are_bad_output(tmp_path, process_box, forged, error):
    problem = load_problem(folder(tmp_path / "p", SIMPLE_TOML, SIMPLE_EVAL))
    if forged == "REPLY":  # the raw reply, written straight to the reply pipe: an integer JSON cannot float
        reply = b'{"scores": {"exact": 1' + b"0" * 400 + b', "close": 1.0}}'
        code = f"import os, sys\nos.write(int(sys.argv[1]), {reply!r})\nos._exit(0)\n"
    else:
        code = f"def forged():\n    return {forged}\n"
    outcome = process_box.evaluate(problem, code)
    if error == "crash":  # the harness in the sandbox cannot float it either: a crash, contained
        assert outcome.error_kind == ErrorKind.CRASH and "OverflowError" in (outcome.error or "")
    else:
        assert outcome.error_kind == ErrorKind.BAD_OUTPUT and error in (outcome.error or ""), outcome.error
    assert outcome.scores == {"exact": 0.0, "close": 0.0}
    assert_vectors(process_box, problem, SIMPLE_KNOWN)


REPLY_FD = "int(sys.argv[1]) if len(sys.argv) > 1 else 3"  # the process harness's argv; Docker's fork mode: 3
DEEP = f"import os, sys\ndef solve(x):\n    os.write({REPLY_FD}, b'[' * 200000)\n    os._exit(0)\n"
HUGE = (
    f"import os, sys\ndef solve(x):\n    fd = {REPLY_FD}\n    os.write(fd, b'[')\n"
    "    for _ in range(40):\n        os.write(fd, b'0,' * (1 << 20))\n    os._exit(0)\n"
)


@pytest.mark.parametrize("attack", [DEEP, HUGE], ids=["deep", "huge"])
def test_deep_or_huge_reply_is_bad_output_in_the_process_sandbox(tmp_path, process_box, attack):
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    outcome = process_box.evaluate(problem, attack)
    assert outcome.error_kind == ErrorKind.BAD_OUTPUT, (outcome.error_kind, outcome.error)
    assert outcome.scores == {"c0": 1e6, "c1": 1e6}
    assert_vectors(process_box, problem, MIN_KNOWN)


@pytest.mark.slow
def test_deep_and_huge_replies_in_docker_are_contained(tmp_path):
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    box = docker_sandbox_or_skip(workers=1)
    try:
        for attack in (DEEP, HUGE):
            outcome = box.evaluate(problem, attack)
            assert outcome.error_kind == ErrorKind.BAD_OUTPUT, (outcome.error_kind, outcome.error)
            assert outcome.scores == {"c0": 1e6, "c1": 1e6}
            assert outcome.duration_s < problem.config.limits.timeout_s + 8
        assert_vectors(box, problem, MIN_KNOWN)
    finally:
        box.close()


DENSE = (  # valid JSON just under the reply cap: the engine must read and reject it in linear time
    f"import os, sys\ndef solve(x):\n    fd = {REPLY_FD}\n    os.write(fd, b'[' + b'0,' * (4 << 20) + b'0]')\n"
    "    os._exit(0)\n"
)
IPC_LEAVE = """import ctypes, os
def solve(x):
    libc = ctypes.CDLL(None, use_errno=True)
    made = libc.shmget(0, 1 << 20, 0o1000 | 0o666) >= 0  # IPC_PRIVATE, IPC_CREAT
    made &= libc.msgget(0, 0o1000 | 0o666) >= 0
    made &= libc.semget(0, 1, 0o1000 | 0o666) >= 0
    mq = libc.mq_open(b"/evolve-left", os.O_CREAT | os.O_RDWR, 0o666, None)
    made &= mq >= 0 or os.path.exists("/dev/mqueue/evolve-left")
    return x * x if made else -1
"""
IPC_LOOK = """import os
def solve(x):
    left = [line for kind in ("shm", "msg", "sem") for line in open(f"/proc/sysvipc/{kind}").readlines()[1:]]
    left += os.listdir("/dev/mqueue")
    return x * x if not left else -1
"""


@pytest.mark.slow
def test_sysv_ipc_and_message_queues_do_not_outlive_a_docker_job(tmp_path):
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    box = docker_sandbox_or_skip(workers=1)
    try:
        left = box.evaluate(problem, IPC_LEAVE)
        assert left.scores == {"c0": 0.0, "c1": 0.0}, (left.case_errors, left.stderr[-300:])
        assert box.evaluate(problem, IPC_LOOK).scores == {"c0": 0.0, "c1": 0.0}
        dense = box.evaluate(problem, DENSE)
        assert dense.error_kind == ErrorKind.BAD_OUTPUT and dense.scores == {"c0": 1e6, "c1": 1e6}
        assert dense.duration_s < problem.config.limits.timeout_s + 8
        assert_vectors(box, problem, MIN_KNOWN)
    finally:
        box.close()


FILL_WORK = """import os
def solve(x):
    written = 0
    try:
        for i in range(64):
            with open(f"/work/fill{x}_{i}", "wb") as f:
                for _ in range(8):
                    f.write(b"x" * (1 << 20))
                    written += 1 << 20
    except OSError:
        pass
    for name in os.listdir("/work"):
        if name.startswith("fill"):
            os.unlink(f"/work/{name}")
    return x * x if 200 << 20 < written < 300 << 20 else -1
"""


def test_the_jailed_work_dir_is_capped_in_total(tmp_path, process_box):
    """Many files each under RLIMIT_FSIZE once filled the host's disk; now /work is a 256 MiB tmpfs per job."""
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    outcome = process_box.evaluate(problem, FILL_WORK)
    assert outcome.scores == {"c0": 0.0, "c1": 0.0}, (outcome.case_errors, outcome.error)
    assert_vectors(process_box, problem, MIN_KNOWN)


def test_work_dirs_of_dead_engines_are_removed_at_start():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = Path(tempfile.gettempdir()) / f"evolve-eval-{dead.pid}-redteam"
    stale.mkdir()
    (stale / "seed.py").write_text("x")
    live = Path(tempfile.gettempdir()) / f"evolve-eval-{os.getppid()}-live"
    live.mkdir()
    try:
        ProcessSandbox(slots=1).close()
        assert not stale.exists() and live.exists()
    finally:
        shutil.rmtree(stale, ignore_errors=True)
        shutil.rmtree(live, ignore_errors=True)


KEYRING = """import ctypes, os
def solve(x):
    libc = ctypes.CDLL(None, use_errno=True)
    nr = {"x86_64": (248, 250), "aarch64": (217, 219)}[os.uname().machine]
    add = libc.syscall(nr[0], b"user", b"evolve-left", b"secret", 6, -4)  # KEY_SPEC_USER_KEYRING
    add_errno = ctypes.get_errno()
    ctl = libc.syscall(nr[1], 0, -4, 0)  # KEYCTL_GET_KEYRING_ID
    denied = add == -1 and add_errno == 1 and ctl == -1 and ctypes.get_errno() == 1
    return x * x if denied else -1
"""


def test_kernel_keyrings_are_out_of_reach_in_the_jail(tmp_path, process_box):
    """Keys outlive processes and are keyed by the slot's uid; the jail's seccomp filter refuses the calls."""
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    outcome = process_box.evaluate(problem, KEYRING)
    assert outcome.scores == {"c0": 0.0, "c1": 0.0}, (outcome.case_errors, outcome.error)
    assert_vectors(process_box, problem, MIN_KNOWN)


ZOMBIE_LEADER = """import ctypes, glob, os, threading, time
PERFECT = "def solve(x):\\n    return x * x\\n"
def _rewrite(mine):
    end = time.time() + 20
    while time.time() < end:
        folder = os.path.dirname(os.path.dirname(mine))
        for path in [mine] + glob.glob(folder + "/evolve-eval-*/" + os.path.basename(mine)):
            try:
                if open(path).read() != PERFECT:
                    with open(path + ".x", "w") as f:
                        f.write(PERFECT)
                    os.rename(path + ".x", path)
            except OSError:
                pass
        time.sleep(0.01)
def solve(x):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            threading.Thread(target=_rewrite, args=(os.path.abspath(__file__),)).start()
            time.sleep(0.2)
            ctypes.CDLL(None).syscall(60, 0)  # SYS_exit of the leader thread alone: /proc shows it as "Z"
        os._exit(0)
    time.sleep(0.5)
    return x
"""


@pytest.mark.parametrize("backend", ["docker", "process-without-jail"])
def test_a_process_whose_leader_thread_exited_does_not_outlive_its_job(tmp_path, backend):
    """Its other threads keep running under a "Z" state: were it skipped as dead, it would rewrite every later
    candidate's program into a perfect one."""
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    box = docker_sandbox_or_skip(workers=1) if backend == "docker" else weak_sandbox_or_skip(slots=1)
    try:
        assert box.evaluate(problem, ZOMBIE_LEADER).scores == {"c0": 2.0, "c1": 6.0}
        for _ in range(3):
            assert_vectors(box, problem, list(reversed(MIN_KNOWN)))
    finally:
        box.close()


BLOATED_REPLY = f"""import json, os, sys
def solve(x):
    error = "E" * 300_000
    os.write({REPLY_FD}, (json.dumps({{"outputs": {{"c0": {{"kind": "crash", "error": error}},
                                                   "c1": {{"kind": "crash", "error": error}}}}}}) + "\\n").encode())
    os._exit(0)
"""


@pytest.mark.parametrize("backend", ["process", "docker"])
def test_a_reply_with_huge_case_errors_is_stored_bounded(tmp_path, backend):
    """What a candidate writes ends in the archive and in prompts: each case error is cut to 500 characters."""
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    if backend == "docker":
        box = docker_sandbox_or_skip(workers=1)
    else:
        if find_jail()[0] is None:
            missing("bubblewrap", find_jail()[1])
        box = ProcessSandbox(slots=1)
    try:
        outcome = box.evaluate(problem, BLOATED_REPLY)
        assert outcome.scores == {"c0": 1e6, "c1": 1e6}
        assert sorted(outcome.case_errors) == ["c0", "c1"]
        assert all(len(e) == 500 and set(e) == {"E"} for e in outcome.case_errors.values())
        assert_vectors(box, problem, MIN_KNOWN)
    finally:
        box.close()


def test_a_simple_form_reply_is_stored_bounded(tmp_path, process_box):
    """The simple form's evaluator runs beside the candidate, so its feedback, metrics and stages are bounded."""
    problem = load_problem(folder(tmp_path / "s", SIMPLE_TOML, SIMPLE_EVAL))
    forged = (
        "def forged():\n"
        "    big = {f'm{i}': float(i) for i in range(5000)}\n"
        "    return {'exact': 0.5, 'close': 0.5, 'error': 'x' * 100_000, **big}\n"
    )
    outcome = process_box.evaluate(problem, forged)
    assert outcome.scores == {"exact": 0.5, "close": 0.5}
    assert len(outcome.metrics) == 256 and len(outcome.feedback or "") <= 8192
    assert_vectors(process_box, problem, SIMPLE_KNOWN)


DEEP_HIDDEN = """import os
def solve(x):
    if x != 2:
        return x
    for entry in os.scandir("/work"):  # our own job files go first: their pages become ours
        if entry.is_file():
            os.unlink(entry.path)
    os.chdir("{top}")
    for i in range(18):  # 18 names of 255 characters: the path is longer than PATH_MAX
        os.mkdir(("d%02d" % i) * 85)
        os.chdir(("d%02d" % i) * 85)
    chunk = b"x" * (1 << 20)
    try:
        for k in range({mb}):
            with open("f%d" % k, "wb") as f:
                f.write(chunk)
    except OSError:
        pass
    return x
"""
LEFTOVER_PROBE = """import os
def solve(x):
    mine = os.path.basename(__file__)
    left = [n for n in os.listdir("/work") if n != mine] + os.listdir("/tmp") + os.listdir("/dev/shm")
    return x * x if not left else -1
"""


@pytest.mark.parametrize("top,mb", [("/work", 300), ("/tmp", 200)], ids=["fill-work", "hold-tmp"])
def test_a_tree_deeper_than_path_max_does_not_outlive_its_docker_job(tmp_path, top, mb):
    """os.walk skips such a tree in silence: it kept /work full (the next honest job failed to be written) or
    held tmpfs memory against every later job. The wipe deletes through directory handles, and a container that
    still has leftovers is replaced."""
    problem = load_problem(folder(tmp_path / "p", MIN_TOML.format(extra=", fail_value = 1e6"), MIN_EVAL))
    box = docker_sandbox_or_skip(workers=1)
    try:
        box.evaluate(problem, DEEP_HIDDEN.format(top=top, mb=mb))
        assert_vectors(box, problem, MIN_KNOWN)
        probe = box.evaluate(problem, LEFTOVER_PROBE)
        assert probe.scores == {"c0": 0.0, "c1": 0.0}, (probe.case_errors, probe.error)  # nothing left anywhere
    finally:
        box.close()
