"""Runs left alone: one failure of a part costs one group; a repeated one stops the run with one line."""

from __future__ import annotations

import pytest

from sandboxes.process import ProcessSandbox
from tests.unattended_runs import evolve, pending_children, unique_children

pytestmark = pytest.mark.slow


def test_one_failure_costs_one_group_and_a_repeated_one_stops_the_run_with_one_line(tmp_path):
    """A policy whose server answers twice, then fails once, answers again, then goes away for good."""
    from evolve.fitness import signs
    from evolve.loop import SearchLoop, run_search
    from policies.replay import ReplayPolicy
    from tests.helpers import square_run

    class FlakyServer(ReplayPolicy):
        max_concurrency = 1
        calls = 0

        def generate(self, prompt, params, n):
            self.calls += 1
            if self.calls == 3 or self.calls > 4:
                raise ConnectionError("connection refused by 127.0.0.1:8000")
            return super().generate(prompt, params, n)

    problem, archive, run, options = square_run(tmp_path, max_evaluations=50, max_failures=3, workers=1)
    policy = FlakyServer(unique_children(3))
    sandbox = ProcessSandbox(slots=1)
    try:
        reason = run_search(SearchLoop(problem, archive, policy, sandbox, run, options))
    finally:
        sandbox.close()
    assert reason.startswith("stopped: 3 sample failures in a row (ConnectionError: connection refused")
    assert "evolve resume DB" in reason
    summary = archive.summarize(archive.runs()[0], signs(problem.components))
    assert summary.status == "stopped" and summary.stop_reason == reason.removeprefix("stopped: ")
    assert summary.incidents == {"sample: ConnectionError": 4}  # the lone one, then three in a row
    assert summary.groups == 3 and pending_children(tmp_path / "a.db") == 0
    shown = evolve("inspect", str(tmp_path / "a.db"))
    assert "incidents (cost one group or child each): {'sample: ConnectionError': 4}" in shown.stdout


def test_a_group_ended_as_interrupted_without_a_cut_is_an_incident_not_the_end_of_the_run(tmp_path):
    """A policy that ends a call as interrupted when nothing cut it (an interrupt request left over from an
    earlier search on the same policy object) costs that group; the run goes on to its own budget."""
    from evolve.fitness import signs
    from evolve.loop import SearchLoop, run_search
    from policies.policy import Generated
    from policies.replay import ReplayPolicy
    from tests.helpers import square_run

    class StaleInterrupt(ReplayPolicy):
        max_concurrency = 1
        calls = 0

        def generate(self, prompt, params, n):
            self.calls += 1
            if self.calls == 1:
                return [Generated("", [], [], "interrupted", self.version) for _ in range(n)]
            return super().generate(prompt, params, n)

    problem, archive, run, options = square_run(tmp_path, max_evaluations=7, workers=1)
    sandbox = ProcessSandbox(slots=1)
    try:
        reason = run_search(SearchLoop(problem, archive, StaleInterrupt(unique_children(6)), sandbox, run, options))
    finally:
        sandbox.close()
    assert reason.startswith("evaluation budget"), reason
    summary = archive.summarize(archive.runs()[0], signs(problem.components))
    assert summary.incidents == {"sample: PolicyError": 1}
    assert summary.evaluations == 7 and summary.groups == 1  # the interrupted call stored nothing
