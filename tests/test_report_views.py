"""The report's aggregation, escaping, CSV export and HTTP API, without a browser."""

from __future__ import annotations

import csv
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import numpy as np
import pytest

from evolve.archive import Archive
from evolve.problem.config import ComponentSpec
from evolve.report.aggregate import pareto_front, running_best
from evolve.selection.population import FeatureSpace, RankedProgram
from tests.report_run import HOSTILE, add_policy_update, make_report_run


@pytest.fixture(scope="module")
def run_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = make_report_run(tmp_path_factory.mktemp("views"))
    add_policy_update(db)
    return db


def test_running_best_keeps_only_improvements_and_the_last_point() -> None:
    values = np.array([np.nan, 1.0, 0.5, 2.0, 2.0, np.nan])
    steps = running_best(values, np.ones(6, dtype=bool), np.arange(10, 16), np.arange(6.0))
    assert (steps.x_eval, steps.y, steps.ids, steps.x_time) == ([2, 4, 6], [1.0, 2.0, 2.0], [11, 13, 13], [1, 3, 5])
    minimised = running_best(np.array([3.0, 5.0, 1.0]), np.ones(3, dtype=bool), np.arange(3), np.arange(3.0), -1.0)
    assert minimised.y == [3.0, 1.0, 1.0]


def test_pareto_front_is_the_non_dominated_set() -> None:
    x = np.array([1.0, 2.0, 3.0, 2.0, 0.5, 3.0])
    y = np.array([3.0, 2.0, 1.0, 1.0, 0.5, 1.0])
    assert sorted(pareto_front(x, y).tolist()) in ([0, 1, 2], [0, 1, 5])


def test_vectorised_cells_match_the_loops_cells() -> None:
    components = [
        ComponentSpec(name="a", bounds=(0.0, 1.0)),
        ComponentSpec(name="b", direction="minimize", fail_value=1e9),
    ]
    rng = np.random.default_rng(1)
    for features in (["code_length", "score"], ["a", "b"], ["score"]):
        space = FeatureSpace(features, components)
        members = [
            RankedProgram(i, 0, 0, rng.normal(size=2), float(rng.normal()), int(rng.integers(1, 5000)))
            for i in range(300)
        ]
        cells = space.cells(
            np.array([m.code_length for m in members]),
            np.array([m.scalar for m in members]),
            np.stack([m.oriented for m in members]),
        )
        assert [tuple(c) for c in cells.tolist()] == [space.cell(m) for m in members]


def test_html_report_holds_every_view_and_no_live_markup(run_db: Path) -> None:
    from evolve.report.page import payload, write_report

    archive = Archive(run_db, create=False)
    run = archive.runs()[-1]
    data = payload(archive, run, with_details=True)
    html = write_report(archive, run)
    archive.close()
    assert HOSTILE not in html and "\\u003c/script\\u003e\\u003cscript\\u003ealert(1)" in html
    # per ensemble member and ask arm (here one replay member): the rows `evolve inspect` prints, and their table
    [member] = [r for r in data["arms"] if r["kind"] == "member"]
    assert member["name"].startswith("replay:") and member["share"] == 1.0 and member["valid"] > 0
    assert sum(r["groups"] for r in data["arms"] if r["kind"] == "ask") == member["groups"] > 0
    assert '<div id="arms"></div>' in html
    best = data["details"][str(data["meta"]["best_id"])]
    assert HOSTILE in best["code"] and HOSTILE in best["stdout"] and HOSTILE in best["completion"]
    assert best["prompt"] and best["parse_status"] == "ok" and best["policy_version"] == 0
    assert best["diff"].startswith(f"--- program {best['parent_id']}")
    assert data["meta"]["best_scalar"] == 1.0 and data["meta"]["errors"] == {"crash": 1}
    assert data["pareto"]["fronts"]["1,2"]  # c0 against c1
    loss = next(t for t in data["figures"]["policy"]["data"] if t["name"] == "loss")
    assert list(loss["text"]) == ["v0", "v1"] and list(loss["y"]) == [None, 0.12]
    figures = data["figures"]
    assert all(figures[k] for k in ("best_eval", "best_time", "errors", "parse", "throughput", "policy"))
    assert figures["grids"]


def test_export_csv_has_times_policy_version_and_parse_status(run_db: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "evolve.cli", "export", str(run_db), str(tmp_path / "out")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "out" / "evaluations.csv") as f:
        rows = list(csv.DictReader(f))
    assert {"created_at", "evaluated_at", "policy_version", "parse_status", "c0", "c1"} <= set(rows[0])
    seed, children = rows[0], rows[1:]
    assert seed["parse_status"] == "seed" and seed["policy_version"] == "" and seed["parent_id"] == ""
    assert children and all(r["parse_status"] == "ok" and r["policy_version"] == "0" for r in children)
    for r in rows:
        assert datetime.fromisoformat(r["evaluated_at"]) >= datetime.fromisoformat(r["created_at"])


def test_report_command_says_what_is_wrong_in_one_line(tmp_path: Path, run_db: Path) -> None:
    base = [sys.executable, "-m", "evolve.cli", "report"]
    missing = subprocess.run(
        [*base, str(tmp_path / "none.db"), "--html", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode != 0 and "no archive there" in missing.stderr + missing.stdout
    bad = subprocess.run(
        [*base, str(run_db), "--html", str(tmp_path / "no" / "dir" / "r.html")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "cannot write the report" in bad.stderr + bad.stdout
    assert "Traceback" not in bad.stderr


@pytest.fixture
def dashboard(run_db: Path) -> Iterator[str]:
    from evolve.report.server import make_dashboard

    archive = Archive(run_db, create=False)
    server = make_dashboard(archive, archive.runs()[-1].id, "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    thread.join(timeout=10)
    archive.close()


def test_dashboard_api_serves_escaped_json_and_answers_unchanged_polls_empty(dashboard: str) -> None:
    data = httpx.get(f"{dashboard}/api/data", timeout=60)
    assert data.status_code == 200 and "<" not in data.text
    payload = data.json()
    assert payload["arms"][0]["kind"] == "member" and payload["arms"][0]["share"] == 1.0
    best = payload["meta"]["best_id"]
    program = httpx.get(f"{dashboard}/api/program/{best}", timeout=30)
    assert "<" not in program.text and HOSTILE in program.json()["code"]
    assert program.headers["X-Content-Type-Options"] == "nosniff"
    lineage = httpx.get(f"{dashboard}/api/lineage/{best}", timeout=30).json()
    assert lineage[-1]["id"] == best or best in [n["id"] for n in lineage]
    assert min(n["id"] for n in lineage) == 1  # back to the seed
    assert httpx.get(f"{dashboard}/api/program/999999", timeout=30).status_code == 404
    again = httpx.get(f"{dashboard}/api/data", params={"key": payload["key"]}, timeout=30)
    assert again.status_code == 204
    page = httpx.get(f"{dashboard}/", timeout=30)
    assert page.status_code == 200 and HOSTILE not in page.text and '<script src="/plotly.js" defer>' in page.text


def test_serve_command_listens_on_loopback_and_serves_the_page(run_db: Path) -> None:
    cmd = [sys.executable, "-m", "evolve.cli", "serve", str(run_db), "--port", "0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        line = ""
        while "serving run" not in line:
            line = proc.stdout.readline()  # type: ignore[union-attr]
            assert line, "evolve serve exited before listening"
        url = line.split(" at ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        page = httpx.get(url, timeout=60)
        assert page.status_code == 200 and "square: run 1" in page.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)
