"""Runs left alone: a jail the sandbox cannot make stops the run with one line, not a crash per child."""

from __future__ import annotations

import json

import pytest

from tests.unattended_runs import unique_children

pytestmark = pytest.mark.slow


def test_a_jail_that_cannot_be_made_stops_the_run_with_one_line_instead_of_scoring_each_child_a_crash(
    tmp_path, monkeypatch
):
    """bubblewrap refusing every jail (here a hidden host file is listed but gone, every time) scored each child
    as its own crash, for as long as the run went on. A refused jail is made once more, then is the sandbox's
    failure, not the candidate's: three in a row stop the run with one line, and the same command resumes."""
    import sandboxes.jail
    from evolve.fitness import signs
    from evolve.loop import SearchLoop, run_search
    from policies.replay import ReplayPolicy
    from tests.helpers import hiding_sandbox, square_run

    gone = "/usr/local/lib/evolve-vanished.conf"
    listings = []

    def listed() -> list[str]:
        listings.append(gone)
        return [gone] if len(listings) > 1 else []  # the seed's jail is made; none after it

    problem, archive, run, options = square_run(tmp_path, max_evaluations=50, max_failures=3, workers=1)
    sandbox = hiding_sandbox("process", 1)
    monkeypatch.setattr(sandboxes.jail, "hidden_host_files", listed)  # after the jail's probe, which lists too
    try:
        reason = run_search(SearchLoop(problem, archive, ReplayPolicy(unique_children(4)), sandbox, run, options))
    finally:
        sandbox.close()
    refused = f"the jail could not be made, twice (bwrap: Can't create file at {gone}: Read-only file system)"
    assert reason.startswith("stopped: 3 evaluate failures in a row (SandboxRefused: process sandbox: "), reason
    assert refused in reason and "evolve resume DB" in reason, reason
    assert len(listings) == 1 + 2 * 3  # the seed's, then each child's jail twice
    summary = archive.summarize(archive.runs()[0], signs(problem.components))
    assert summary.incidents == {"evaluate: SandboxRefused": 3} and summary.status == "stopped"


def test_a_jail_refused_at_the_seed_ends_evolve_run_with_one_line(tmp_path, monkeypatch):
    """The seed's evaluation is the run's: its sandbox refusing ended `evolve run` in a traceback."""
    from typer.testing import CliRunner

    import sandboxes.jail
    from evolve.cli import app
    from tests.helpers import write_square_problem

    real, listings = sandboxes.jail.hidden_host_files, []
    gone = "/usr/local/lib/evolve-vanished.conf"

    def listed() -> list[str]:
        listings.append(gone)
        return real() if len(listings) == 1 else [gone]  # the jail's probe passes; every job's jail is refused

    monkeypatch.setattr(sandboxes.jail, "hidden_host_files", listed)
    replay = tmp_path / "answers.json"
    replay.write_text(json.dumps(unique_children(1)))
    folder = write_square_problem(tmp_path / "sq")
    argv = ["run", str(folder), "--db", str(tmp_path / "a.db"), "--policy", f"replay:{replay}", "--sandbox", "process"]
    shown = CliRunner().invoke(app, [*argv, "--max-evaluations", "4"], env={"COLUMNS": "400"}, terminal_width=400)
    assert shown.exit_code == 2, shown.output
    said = f"the jail could not be made, twice (bwrap: Can't create file at {gone}: Read-only file system)"
    assert f"error: the run stopped: process sandbox: {said}" in shown.output, shown.output
    assert "Traceback" not in shown.output and len(listings) == 3
