"""A run shows the group it is sampling while it samples, and `--max-time` cuts that group as Ctrl-C does."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time

import pytest
import typer

from evolve.cli.run_cmd import DEFAULT_LINE_PERIOD_S, LINE_PERIOD_ENV, line_period_s
from evolve.loop import SearchLoop, run_search
from policies.policy import SamplingParams
from policies.transformers_policy import TransformersPolicy
from sandboxes.process import ProcessSandbox
from tests.forked_cli import FORKED
from tests.helpers import evolve_run_cmd, square_run, write_square_problem

pytestmark = pytest.mark.slow


def test_the_time_budget_cuts_the_group_being_sampled_and_stores_none_of_it(tmp_path, endless_model_dir):
    policy = TransformersPolicy.load(str(endless_model_dir))
    problem, archive, run, options = square_run(
        tmp_path, max_evaluations=50, max_time_s=6.0, max_new_tokens=10**6, fit_tokens_to_code=False
    )
    loop = SearchLoop(problem, archive, policy, ProcessSandbox(2), run, options)
    outcome: list[str] = []
    started = time.monotonic()
    worker = threading.Thread(target=lambda: outcome.append(run_search(loop)), daemon=True)
    worker.start()
    worker.join(timeout=60)  # without the cut the first group samples 10**6 tokens per row
    assert not worker.is_alive(), "the run overran its time budget"
    assert outcome == ["time budget reached"]
    assert time.monotonic() - started < 6.0 + 10.0  # the limit, model loading aside, and a token or so
    con = sqlite3.connect(tmp_path / "a.db")
    assert con.execute("SELECT COUNT(*) FROM prompts").fetchone()[0] == 0  # the cut group left no trace
    assert con.execute("SELECT COUNT(*) FROM completions").fetchone()[0] == 0
    assert con.execute("SELECT status FROM runs").fetchone()[0] == "finished"
    normal = policy.generate("x", SamplingParams(0.8, 0.95, 5), 2)  # the cut's interrupt was consumed
    assert [(g.finish_reason, len(g.token_ids or [])) for g in normal] == [("length", 5)] * 2


def test_without_a_terminal_a_line_every_period_shows_the_tokens_sampled_so_far(tmp_path, endless_model_dir):
    """The lines come every $EVOLVE_PROGRESS_EVERY_S (10 s unless set; 0.5 s here, so that a few seconds of
    sampling show several lines), and `--max-time` ends the command line's run in the group being sampled."""
    folder = write_square_problem(tmp_path / "sq")
    max_time = 4
    extra = ("--max-new-tokens", "100000", "--no-fit-tokens-to-code", "--max-time", str(max_time))
    cmd = evolve_run_cmd(folder, tmp_path / "run.db", f"transformers:{endless_model_dir}", 20, *extra)
    env = {**os.environ, LINE_PERIOD_ENV: "0.5"}
    done = FORKED.run(cmd[3:], timeout=300, env=env)  # a process of its own, forked after the CLI's imports
    assert done.returncode == 0, done.stderr[-2000:]
    assert "time budget reached" in done.stdout
    state = sqlite3.connect(tmp_path / "run.db").execute("SELECT state FROM runs").fetchone()[0]
    assert json.loads(state)["elapsed_s"] < max_time + 5  # the run's own clock: the group was cut at the limit
    assert "policy: " in done.stdout and "transformers on cpu" in done.stdout
    counts = [int(n) for n in re.findall(r"sampling 4 rows: (\d+) tokens", done.stdout)]
    assert len(counts) >= 2, done.stdout[-3000:]
    assert counts == sorted(counts) and counts[-1] > counts[0] > 0  # it advances between lines


def test_the_line_period_is_10s_unless_set_and_a_bad_setting_is_one_clear_error(monkeypatch, capsys):
    monkeypatch.delenv(LINE_PERIOD_ENV, raising=False)
    assert line_period_s() == DEFAULT_LINE_PERIOD_S == 10.0
    monkeypatch.setenv(LINE_PERIOD_ENV, "2.5")
    assert line_period_s() == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv(LINE_PERIOD_ENV, bad)
        with pytest.raises(typer.Exit) as exited:
            line_period_s()
        assert exited.value.exit_code == 2
        said = capsys.readouterr().err
        assert f"{LINE_PERIOD_ENV}='{bad}'" in said and "positive number" in said and len(said.splitlines()) == 1
