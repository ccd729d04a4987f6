"""`benchmarks/yield.py --compare-structured`: each problem sampled twice from one seed, free then held to the
answer's shape by llama.cpp's grammar (a tiny GGUF made on the spot), and a last line whose figures are those of
the two archives it kept."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.yields import UNPARSEABLE

ROOT = Path(__file__).resolve().parent.parent


def run_yield(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python -m benchmarks.yield ARGV` as a user runs it (tests import nothing from benchmarks/)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "benchmarks.yield", *argv]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)


pytestmark = pytest.mark.slow


def archive_figures(db) -> tuple[float, float, list]:
    """Unparseable share, new valid children per 1k tokens and each completion's stored `structured`."""
    con = sqlite3.connect(db)
    statuses = dict(con.execute("SELECT status, COUNT(*) FROM variants GROUP BY status").fetchall())
    bad = sum(statuses.get(s, 0) for s in UNPARSEABLE) / sum(statuses.values())
    tokens = con.execute("SELECT SUM(tokens) FROM prompts").fetchone()[0]
    valid = con.execute(
        "SELECT COUNT(*) FROM programs p JOIN evaluations e ON e.program_id = p.id "
        "WHERE p.parent_id IS NOT NULL AND e.error_kind IS NULL"
    ).fetchone()[0]
    shapes = [json.loads(s)["structured"] for (s,) in con.execute("SELECT sampling FROM completions")]
    return bad, 1000 * valid / tokens, shapes


def shape_failures(db) -> int:
    """Variants whose answer had no shape to read (`parse_error`: a variant missing, no fenced code)."""
    return sqlite3.connect(db).execute("SELECT COUNT(*) FROM variants WHERE status = 'parse_error'").fetchone()[0]


def test_compare_structured_runs_each_problem_off_then_on_and_reports_the_archives(tmp_path, tiny_gguf):
    keep = tmp_path / "kept"
    argv = ["--compare-structured", "--problems", "minimizer", "--groups", "1", "--policy", f"llama:{tiny_gguf}"]
    # The shape alone: the tiny model was taught answers without a lead comment; held to one, it wrote noise after
    # it (11 of 12 variants syntax errors, 1 ok; free: 10 unparseable, 2 ok), which says nothing about the shape.
    argv += ["--lead-comment", "off"]
    ran = run_yield(*argv, "--keep", str(keep))
    assert ran.returncode == 0, ran.stderr[-3000:]
    last = ran.stdout.strip().splitlines()[-1]
    figures = dict(re.findall(r"(\w+)=([^ ]+)", last))
    assert last.startswith("structured ") and set(figures) == {
        "unparseable_off", "unparseable_on", "children_per_1k_tokens_off", "children_per_1k_tokens_on",
        "tok_s_off", "tok_s_on", "under_one_child_per_completion_on",
    }  # fmt: skip
    off, on = archive_figures(keep / "off" / "minimizer.db"), archive_figures(keep / "on" / "minimizer.db")
    assert float(figures["unparseable_off"].rstrip("%")) == pytest.approx(100 * off[0], abs=0.05)
    assert float(figures["unparseable_on"].rstrip("%")) == pytest.approx(100 * on[0], abs=0.05)
    assert float(figures["children_per_1k_tokens_off"]) == pytest.approx(off[1], abs=0.005)
    assert float(figures["children_per_1k_tokens_on"]) == pytest.approx(on[1], abs=0.005)
    assert float(figures["tok_s_off"]) > 0 and float(figures["tok_s_on"]) > 0
    assert off[2] and all(shape is None for shape in off[2])  # off: free text
    assert on[2] and all(shape and shape["variants"] >= 1 for shape in on[2])  # on: each row held to a shape
    # the tiny model writes noise: free, some of its answers lose their shape (a variant missing, no fenced code);
    # held, none does, and what is left unparseable is the noise inside a held fence (a syntax error)
    assert shape_failures(keep / "off" / "minimizer.db") > 0
    assert shape_failures(keep / "on" / "minimizer.db") == 0


def test_compare_structured_refuses_a_policy_without_a_grammar(tmp_path, tiny_model_dir):
    """An OpenAI-compatible server that ignores the grammar field (the tests' loopback one) holds nothing: the
    comparison would measure free text twice."""
    from tests.openai_server import LoopbackServer

    server = LoopbackServer(tiny_model_dir).start()
    try:
        spec = f"openai:{server.url}@{server.model_name}"
        argv = ["--compare-structured", "--problems", "minimizer", "--policy", spec, "--keep", str(tmp_path)]
        refused = run_yield(*argv)
    finally:
        server.stop()
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "cannot hold its answers to a grammar" in refused.stderr
    assert [path for path, _ in server.requests] == ["/v1/chat/completions"]  # the probe alone: nothing sampled
