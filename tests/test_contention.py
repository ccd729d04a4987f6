"""Sampling and evaluation share the CPU: llama.cpp's decoding threads follow the evaluations in flight in a real
process sandbox, and a real candidate runs at the lower CPU weight the sandbox gives it (nice, and the nice of
its session's autogroup, without which nice does nothing between sessions)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from evolve.problem import load_problem
from evolve.problem.samples import write_problem
from sandboxes.cpu_share import CANDIDATE_NICE
from tests.helpers import hiding_sandbox, need_llama, reported

pytestmark = pytest.mark.slow

# Waits, without burning a core, until the test drops `go` into the problem's data folder (bound read-only into
# the jail, so the file shows there at once).
WAITS_FOR_GO = """
import os, time
def solve(x):
    go = os.path.join(os.environ["EVOLVE_DATA_DIR"], "go")
    deadline = time.monotonic() + 25
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    return x * x
"""

REPORTS_WEIGHT = """
import os
def solve(x):
    with open("/proc/self/autogroup") as f:
        group = f.read().split()[-1]
    return [os.nice(0), int(group)]
"""


def _problem(root: Path, seed: str) -> object:
    folder = write_problem(root, seed=seed, timeout=30.0)
    (folder / "data").mkdir()
    return load_problem(folder)


def _threads_now(policy) -> int:
    runtime = policy.runtime
    return int(runtime.lib.llama_n_threads(runtime.ctx))


def test_decoding_threads_follow_the_evaluations_in_flight(tiny_gguf, tmp_path, monkeypatch):
    need_llama()
    from policies.from_spec import make_policy
    from policies.policy import SamplingParams

    monkeypatch.setenv("EVOLVE_LLAMA_THREADS", "3")  # three cores' worth, whatever this test is pinned to
    problem = _problem(tmp_path / "p", WAITS_FOR_GO)
    sandbox = hiding_sandbox("process", 2)
    policy = make_policy(f"llama:{tiny_gguf}")
    try:
        policy.share_cores(sandbox.evaluations_in_flight)
        params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=4, seed=1)
        policy.generate("square", params, 2)
        assert _threads_now(policy) == 3  # nothing evaluates: every core decodes

        outcomes: list[object] = []
        worker = threading.Thread(target=lambda: outcomes.append(sandbox.evaluate(problem, WAITS_FOR_GO)))
        worker.start()
        deadline = time.monotonic() + 20
        while sandbox.evaluations_in_flight() != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sandbox.evaluations_in_flight() == 1
        policy.generate("square", params, 2)
        assert _threads_now(policy) == 2  # one core left to the evaluation

        (tmp_path / "p" / "data" / "go").touch()
        worker.join(30)
        assert outcomes and outcomes[0].scores == {"c0": 1.0, "c1": 1.0}, outcomes  # type: ignore[attr-defined]
        assert sandbox.evaluations_in_flight() == 0
        policy.generate("square", params, 2)
        assert _threads_now(policy) == 3  # the core comes back once it ends
    finally:
        policy.close()
        sandbox.close()


def test_decoding_keeps_one_thread_however_many_evaluations_run(tiny_gguf, monkeypatch):
    need_llama()
    from policies.from_spec import make_policy
    from policies.policy import SamplingParams

    monkeypatch.setenv("EVOLVE_LLAMA_THREADS", "2")
    policy = make_policy(f"llama:{tiny_gguf}")
    try:
        policy.share_cores(lambda: 5)
        policy.generate("square", SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=4, seed=1), 2)
        assert _threads_now(policy) == 1
        assert "the cores evaluations leave free" in policy.description
    finally:
        policy.close()


def test_a_jailed_candidate_runs_at_the_cpu_weight_asked_for(tmp_path):
    from sandboxes.jail import find_jail
    from sandboxes.process import ProcessSandbox
    from tests.services import missing

    jail, why = find_jail()
    if jail is None:
        missing("bubblewrap", why)
    problem = _problem(tmp_path / "p", REPORTS_WEIGHT)
    sandbox = ProcessSandbox(slots=1, nice=CANDIDATE_NICE)
    assert sandbox.hides_files, sandbox.isolation()
    try:
        outcome = sandbox.evaluate(problem, REPORTS_WEIGHT)
    finally:
        sandbox.close()
    assert reported(outcome) == [CANDIDATE_NICE, CANDIDATE_NICE]  # its own nice, and its session's autogroup's
    assert f"nice {CANDIDATE_NICE}" in sandbox.isolation()


def test_a_candidate_outside_the_jail_runs_at_the_lower_cpu_weight(tmp_path):
    from tests.helpers import weak_sandbox_or_skip

    problem = _problem(tmp_path / "p", REPORTS_WEIGHT)
    sandbox = weak_sandbox_or_skip(slots=1, nice=CANDIDATE_NICE)
    try:
        outcome = sandbox.evaluate(problem, REPORTS_WEIGHT)  # type: ignore[attr-defined]
    finally:
        sandbox.close()  # type: ignore[attr-defined]
    assert reported(outcome) == [CANDIDATE_NICE, CANDIDATE_NICE]


@pytest.mark.docker
def test_the_docker_sandbox_counts_its_evaluations_in_flight(tmp_path):
    from sandboxes.cpu_share import CountsEvaluations
    from tests.helpers import docker_sandbox_or_skip

    problem = _problem(tmp_path / "p", WAITS_FOR_GO)
    sandbox = docker_sandbox_or_skip(workers=1)
    try:
        assert isinstance(sandbox, CountsEvaluations)  # so that build_search hands its count to the policy
        outcomes: list[object] = []
        worker = threading.Thread(target=lambda: outcomes.append(sandbox.evaluate(problem, WAITS_FOR_GO)))
        worker.start()
        deadline = time.monotonic() + 60
        while sandbox.evaluations_in_flight() != 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sandbox.evaluations_in_flight() == 1
        (tmp_path / "p" / "data" / "go").touch()
        worker.join(60)
        assert outcomes and outcomes[0].scores == {"c0": 1.0, "c1": 1.0}, outcomes  # type: ignore[attr-defined]
        assert sandbox.evaluations_in_flight() == 0
    finally:
        sandbox.close()  # type: ignore[attr-defined]


def test_a_run_hands_its_sandboxs_count_to_its_llama_policy(tiny_gguf, tmp_path, monkeypatch):
    need_llama()
    from evolve.runs import RunOverrides
    from evolve.search import build_search

    monkeypatch.setenv("EVOLVE_LLAMA_THREADS", "3")
    problem = _problem(tmp_path / "p", WAITS_FOR_GO)
    overrides = RunOverrides(sandbox="process")
    search = build_search(problem, overrides, db=tmp_path / "a.db", policies=[f"llama:{tiny_gguf}"])
    try:
        threads = search.policy.cores.threads  # type: ignore[attr-defined]
        assert threads() == 3
        with search.sandbox.evaluations_in_flight.running():  # type: ignore[attr-defined]
            assert threads() == 2
        assert "the cores evaluations leave free" in search.policy.description  # type: ignore[attr-defined]
    finally:
        search.close()
