"""Yield, adaptation, stalls and Ctrl-C in the real loop, with tiny models made on the spot."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from evolve.archive import summary_yield
from evolve.loop import SearchLoop, run_search
from policies.base import SamplingParams
from policies.transformers_policy import TransformersPolicy
from sandboxes.process import ProcessSandbox
from tests.helpers import evolve_run_cmd, square_run, write_square_problem

pytestmark = pytest.mark.slow


def _save_tiny(directory, **kwargs):
    from policies.tiny import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, **kwargs)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def endless_model_dir(tmp_path_factory):
    """An untaught tiny model that cannot reach its end-of-sequence token: it writes until told to stop."""
    from policies.tiny import tiny_tokenizer

    return _save_tiny(tmp_path_factory.mktemp("endless"), vocab_size=len(tiny_tokenizer()) - 2)


def test_yield_from_the_archive_matches_the_live_counters_and_prompts_show_recent_children(tmp_path, tiny_model_dir):
    problem, archive, run, options = square_run(tmp_path, max_evaluations=10)
    loop = SearchLoop(problem, archive, TransformersPolicy.load(str(tiny_model_dir)), ProcessSandbox(2), run, options)
    run_search(loop)
    summary = archive.summarize(run)
    y = summary_yield(summary)
    assert summary.yields == y.as_dict()  # what `evolve inspect --json` prints
    con = sqlite3.connect(tmp_path / "a.db")
    assert y.completions == loop.stats.completions == con.execute("SELECT COUNT(*) FROM completions").fetchone()[0]
    assert y.tokens == loop.stats.tokens > 0
    ok_children = con.execute(
        "SELECT COUNT(*) FROM programs p JOIN evaluations e ON e.program_id = p.id "
        "WHERE p.parent_id IS NOT NULL AND e.error_kind IS NULL"
    ).fetchone()[0]
    assert y.new_valid == loop.stats.new_valid == ok_children > 0
    assert y.variants == 2 * y.completions  # m answers per completion, always
    assert 0 < y.per_completion <= 2 and y.per_1k_tokens == pytest.approx(1000 * ok_children / y.tokens)
    assert "yield" in loop.stats.summary()
    # the next prompt from the seed shows its two newest children, read from the archive (so a resume keeps them)
    seed = loop.population.first
    children = [c for (c,) in con.execute("SELECT code FROM programs WHERE parent_id = ? ORDER BY id", (seed.id,))]
    assert len(children) >= 2
    _codes, edit_format, prompt = loop._prompt(seed, [], loop.adapter.ask)
    assert edit_format == "full"
    shown = prompt.split("# Recent children of the current program")[1].split("# Task")[0]
    body = [c.split("# EVOLVE-BLOCK-START\n")[1].split("# EVOLVE-BLOCK-END")[0].strip() for c in children[-2:]]
    assert all(b in shown for b in body) and shown.index(body[0]) < shown.index(body[1])
    sampling = [json.loads(s) for (s,) in con.execute("SELECT sampling FROM completions ORDER BY id")]
    assert {s["edit_format"] for s in sampling} == {"full"} and sampling[0]["template"] == "directed"
    state = json.loads(con.execute("SELECT state FROM runs").fetchone()[0])
    asked = {(s["template"], s["temperature"]) for s in sampling}
    assert len(asked) == 1 + len(state.get("adaptations", []))  # every other ask was a recorded change


def test_barren_groups_change_the_ask_record_it_and_stall_keeping_tokens_and_m_answers(tmp_path):
    untaught = _save_tiny(tmp_path / "untaught")  # writes noise: every variant is unparseable
    problem, archive, run, options = square_run(
        tmp_path, max_evaluations=50, max_new_tokens=24, adapt_every=1, stall_groups=3
    )
    loop = SearchLoop(problem, archive, TransformersPolicy.load(str(untaught)), ProcessSandbox(2), run, options)
    reason = run_search(loop)
    assert reason.startswith("stalled: 3 groups without a new child: 0% unchanged, 0% duplicate, 100% unparseable")
    assert "tried: prompt template directed -> standard; temperature 0.7 -> 0.9" in reason
    assert "\n" not in reason
    con = sqlite3.connect(tmp_path / "a.db")
    state = json.loads(con.execute("SELECT state FROM runs").fetchone()[0])
    assert [c["change"] for c in state["adaptations"]] == [
        "prompt template directed -> standard",
        "temperature 0.7 -> 0.9",
    ]
    assert state["ask"] == {"edit_format": "full", "temperature": 0.9, "template": "standard"}
    assert state["stop_reason"] == reason  # the stall line is kept with the run
    rows = con.execute(
        "SELECT p.id, c.sampling, c.token_ids, c.logprobs, "
        "(SELECT COUNT(*) FROM variants v WHERE v.completion_id = c.id) "
        "FROM completions c JOIN prompts p ON p.id = c.prompt_id ORDER BY c.id"
    ).fetchall()
    asked = {pid: (json.loads(s)["template"], json.loads(s)["temperature"]) for pid, s, *_ in rows}
    assert asked == {1: ("directed", 0.7), 2: ("standard", 0.7), 3: ("standard", 0.9)}
    prompts = [t for (t,) in con.execute("SELECT text FROM prompts ORDER BY id")]
    assert "Variant 2: a different method" in prompts[0] and "Variant 2: a different method" not in prompts[1]
    for _, _, ids, lps, m in rows:  # what the trainer needs survives every change of the ask
        assert len(ids) // 4 == len(lps) // 4 > 0 and m == 2
    inspect = subprocess.run(
        [sys.executable, "-m", "evolve.cli", "inspect", str(tmp_path / "a.db")], capture_output=True, text=True
    )
    assert "yield 0 new valid children: 0.00 per completion" in inspect.stdout
    assert "unparseable 100%" in inspect.stdout
    assert "adapted at group 1: temperature 0.7 -> 0.9" in inspect.stdout


def test_interrupt_ends_a_generation_between_tokens_and_is_never_lost(endless_model_dir):
    policy = TransformersPolicy.load(str(endless_model_dir))
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(policy.generate("x", SamplingParams(0.8, 0.95, 10**6), 3)))
    worker.start()
    time.sleep(0.5)
    asked = time.monotonic()
    policy.interrupt()
    worker.join(timeout=5)
    assert not worker.is_alive() and time.monotonic() - asked < 1.0
    assert [g.finish_reason for g in out] == ["interrupted"] * 3
    policy.interrupt()  # between two calls: the next one ends at once
    assert [g.finish_reason for g in policy.generate("x", SamplingParams(0.8, 0.95, 10**6), 2)] == [
        "interrupted"
    ] * 2
    normal = policy.generate("x", SamplingParams(0.8, 0.95, 6), 2)  # honoured once, then cleared
    assert [(g.finish_reason, len(g.token_ids or [])) for g in normal] == [("length", 6)] * 2


def test_ctrl_c_mid_generation_stops_within_a_second_or_so_and_commits_no_half_group(tmp_path, endless_model_dir):
    folder = write_square_problem(tmp_path / "sq")
    db = tmp_path / "run.db"
    cmd = evolve_run_cmd(
        folder, db, f"transformers:{endless_model_dir}", 20, "--max-new-tokens", "100000", "--no-fit-tokens-to-code"
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
        try:
            if sqlite3.connect(db).execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] >= 1:
                break
        except sqlite3.OperationalError:
            continue
    time.sleep(2.0)  # the seed is scored: the first group is being generated now
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    waited = time.monotonic() - sent
    assert waited < 3.0, f"took {waited:.1f}s to stop"
    assert proc.returncode == 0, stderr[-2000:]
    assert "interrupted" in stdout
    con = sqlite3.connect(db)
    assert con.execute("SELECT COUNT(*) FROM prompts").fetchone()[0] == 0  # the cut group left no trace
    assert con.execute("SELECT COUNT(*) FROM completions").fetchone()[0] == 0
    assert con.execute("SELECT COUNT(*) FROM evaluations").fetchone()[0] == 1
    assert con.execute("SELECT status FROM runs").fetchone()[0] == "stopped"
