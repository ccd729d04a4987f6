"""The throughput view spreads a group's tokens over the seconds they were sampled in, not at the group's end."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
from sqlalchemy import update

from evolve.archive import Archive
from evolve.archive.clock import utcnow
from evolve.archive.inserts import CompletionRecord, GroupTelemetry
from evolve.archive.models import Program, Run
from evolve.options import RunOptions
from evolve.problem import load_problem
from evolve.report.aggregate import spread
from evolve.report.build import build_views
from evolve.runs import open_run
from tests.helpers import write_square_problem


def test_a_slow_groups_tokens_are_spread_over_its_sampling_time(tmp_path: Path) -> None:
    archive = Archive(tmp_path / "runs.db")
    problem = load_problem(write_square_problem(tmp_path / "square"))
    run = open_run(archive, problem, RunOptions.for_problem(problem.config.search, policy="embedded")).run
    now = utcnow()
    with archive.db.session() as s:  # the run began 300 s ago; its seed is the group's parent
        s.execute(update(Run).where(Run.id == run.id).values(created_at=now - timedelta(seconds=300)))
        seed = Program(run_id=run.id, code=problem.seed_code, code_hash="0" * 64, island=0, generation=0)
        s.add(seed)
        s.flush()
        parent = seed.id
    # one group of 4 rows, 90 tokens each, sampled from 200 s to 80 s ago (3 tokens/s), stored now
    rows = [CompletionRecord("x", list(range(90)), [-1.0] * 90, "length", None) for _ in range(4)]
    archive.add_group(
        run.id,
        parent_id=parent,
        inspiration_ids=[],
        island=0,
        prompt="p",
        sampling={},
        completions=rows,
        variants=[[("unparseable", None, None)] for _ in rows],
        telemetry=GroupTelemetry(360, 120.0, now - timedelta(seconds=200), {"unparseable": 4}),
    )
    run = next(r for r in archive.runs() if r.id == run.id)
    tp = build_views(archive, run).throughput
    t, rate = np.array(tp["t"]), np.array(tp["tokens_per_s"])
    width = t[1] - t[0]
    assert tp["tokens_total"] == 360 and abs(rate.sum() * width - 360) < 1e-6
    inside = (t - width / 2 >= 100 + 1e-9) & (t + width / 2 <= 220 - 1e-9)
    assert inside.sum() >= 10 and np.allclose(rate[inside], 3.0)  # 360 tokens over 120 s, in every bucket
    assert rate.max() <= 3.0 + 1e-9  # no spike where the group was stored
    assert np.all(rate[t + width / 2 <= 100] == 0) and np.all(rate[t - width / 2 >= 220] == 0)
    archive.close()


def test_spread_keeps_each_amount_and_puts_an_instant_in_its_bucket() -> None:
    edges = np.linspace(0.0, 300.0, 11)
    totals = spread(edges, np.array([0.0, 100.0, 250.0]), np.array([300.0, 100.0, 250.5]), np.array([900.0, 10, 5]))
    assert totals.tolist() == [90.0, 90.0, 90.0, 100.0, 90.0, 90.0, 90.0, 90.0, 95.0, 90.0]
