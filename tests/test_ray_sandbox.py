"""Evaluations on a real two-node Ray cluster (started with `ray start` on loopback): a run that loses its
second node mid-way still finishes, with every child evaluated exactly once in the archive and executed
exactly once outside the lost node (the evaluator's own log says which process executed what)."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import time

import pytest

from tests.helpers import write_problem
from tests.ray_cluster import RayCluster, drop_netns, in_netns, make_netns, ray_env
from tests.services import missing

pytestmark = pytest.mark.slow

# Each child sleeps a moment, so that evaluations are in flight on both nodes when one is lost; after the loss the
# remaining children run on the survivor's two actors, where each second slept counts about ninefold.
SLOW_VARIANT = (
    "<variant 1>\n```python\ndef solve(x):\n    import time\n    time.sleep(0.3)\n    return [x * x, {i}]\n```\n"
    "</variant 1>\n"
)
SEED = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return [x * x, 0]\n# EVOLVE-BLOCK-END\n"
# Each program answers [its result, its tag]; the trusted score() runs in the Ray actor that executed the
# candidate, and logs the tag with that actor's pid once per execution.
EVALUATOR = """
import os


def cases():
    return [{{"name": "c0", "input": 2, "expected": 4}}, {{"name": "c1", "input": 3, "expected": 9}}]


def score(case, output):
    value, tag = output
    if case["name"] == "c0":
        with open({log!r}, "a") as log:
            log.write(f"{{tag}} {{os.getpid()}}\\n")
    return (1.0 if value == case["expected"] else 0.0), None
"""


@pytest.fixture(scope="module")
def ray_cluster():
    try:
        import ray  # noqa: F401
    except ImportError:
        missing("Ray", "not installed (pip install 'vpo-evolve[ray]')")
    try:
        make_netns()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        missing("Ray", f"no loopback-only network namespace for the cluster: {exc}")
    try:
        cluster = RayCluster.start(cpus=2)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        drop_netns()
        missing("Ray", f"cannot start a head node: {exc}")
    try:
        cluster.add_node(cpus=2)
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        cluster.stop()
        drop_netns()
        missing("Ray", f"cannot start a second node: {exc}")
    yield cluster
    cluster.stop()
    drop_netns()


def test_run_survives_losing_a_node_and_evaluates_each_child_once(tmp_path, ray_cluster):
    log = tmp_path / "executions.log"
    evaluator = EVALUATOR.format(log=str(log))
    folder = write_problem(tmp_path / "prob", name="rayrun", timeout=10.0, seed=SEED, evaluate=evaluator)
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([SLOW_VARIANT.format(i=i) for i in range(1, 200)]))
    db = tmp_path / "run.db"
    budget = 24
    cmd = [
        "python3", "-m", "evolve.cli", "run", str(folder), "--db", str(db), "--policy", f"replay:{replay}",
        "--sandbox", f"ray:{ray_cluster.address}", "--workers", "4", "--group-size", "2", "--variants", "1",
        "--edit-format", "full", "--max-evaluations", str(budget),
        "--no-stop-when-solved",  # the seed already scores 1.0 on every bounded case
    ]  # fmt: skip
    proc = subprocess.Popen(in_netns(cmd), env=ray_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    seen = 0
    while time.monotonic() < deadline and proc.poll() is None and seen < 6:
        time.sleep(0.3)
        if db.exists():
            try:
                seen = sqlite3.connect(db).execute("SELECT COUNT(*) FROM evaluations").fetchone()[0]
            except sqlite3.OperationalError:
                continue
    assert proc.poll() is None, f"the run ended before the node could be lost: {proc.communicate()}"
    lost = set(ray_cluster.kill_second_node())
    assert len(lost) >= 2
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, (out[-2000:], err[-3000:])
    assert "evaluation budget reached" in out, out
    assert "Ray actors (4) on 2 node(s)" in out, out  # the run really used both nodes
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == budget
    assert con.execute("SELECT COUNT(*) FROM programs").fetchone()[0] == budget
    # exactly once: one evaluation per program, no program twice, no child left pending or lost as a crash
    assert con.execute("SELECT COUNT(DISTINCT program_id) FROM evaluations").fetchone()[0] == budget
    assert con.execute("SELECT COUNT(*) - COUNT(DISTINCT code_hash) FROM programs").fetchone()[0] == 0
    assert con.execute("SELECT COUNT(*) FROM evaluations WHERE error_kind IS NOT NULL").fetchone()[0] == 0
    assert {s for (s,) in con.execute("SELECT DISTINCT scores FROM evaluations")} == {'{"c0": 1.0, "c1": 1.0}'}
    assert set(con.execute("SELECT DISTINCT sandbox FROM evaluations").fetchall()) <= {("process",), ("docker",)}
    # Executed exactly once, by the log (in time order): a tag runs twice only when its first execution was in
    # a process of the lost node (in flight when it died, so sent again) and its second in a survivor; no more
    # tags than the lost node had evaluations in flight (its two CPUs hold at most two one-slot actors).
    runs: dict[str, list[int]] = {}
    for line in log.read_text().splitlines():
        tag, pid = line.split()
        runs.setdefault(tag, []).append(int(pid))
    committed = {re.search(r"\[x \* x, (\d+)\]", code).group(1) for (code,) in con.execute("SELECT code FROM programs")}
    assert set(runs) == committed and len(committed) == budget, (sorted(runs), sorted(committed))
    repeated = {tag: pids for tag, pids in runs.items() if len(pids) > 1}
    assert all(len(pids) == 2 and pids[0] in lost and pids[1] not in lost for pids in repeated.values()), runs
    assert len(repeated) <= 2, runs
    print(f"ray: {len(runs)} programs executed, {len(repeated)} re-sent after the node loss")
