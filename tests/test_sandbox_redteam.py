"""The red team's findings, replayed: failures that outscored honest answers, replies that escaped evaluate().
(What a job leaves behind, in the jail and after it: tests/test_sandbox_redteam_residue.py.)

Each attack is followed by known programs whose exact vectors are asserted, so containment means the next
answers are right, not merely that the attack ended in some error.
"""

from __future__ import annotations

import textwrap

import pytest

from evolve.problem import ProblemError, load_problem
from evolve.problem.config import FitnessSection
from evolve.problem.outcome import ErrorKind
from sandboxes.jail import find_jail
from sandboxes.process import ProcessSandbox
from tests.helpers import docker_sandbox_or_skip, simple_form_toml
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

SIMPLE_TOML = simple_form_toml(("exact", "close"), timeout_s=3)
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
