"""Yield, adaptation, stalls and Ctrl-C in the real loop, with tiny models made on the spot."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import replace

import pytest

from evolve.archive import summary_yield
from evolve.fitness import signs
from evolve.group_sampler import structured_by
from evolve.loop import SearchLoop, run_search
from policies.policy import Generated, SamplingParams
from policies.transformers_policy import TransformersPolicy
from sandboxes.process import ProcessSandbox
from tests.helpers import SQUARE_SEED, evolve_run_cmd, save_tiny, square_run, write_square_problem

pytestmark = pytest.mark.slow


def test_yield_from_the_archive_matches_the_live_counters_and_prompts_show_recent_children(tmp_path, tiny_model_dir):
    problem, archive, run, options = square_run(tmp_path, max_evaluations=10)
    loop = SearchLoop(problem, archive, TransformersPolicy.load(str(tiny_model_dir)), ProcessSandbox(2), run, options)
    run_search(loop)
    summary = archive.summarize(run, signs(problem.components))
    y = summary_yield(summary)
    assert summary.yields == y.as_dict()  # what `evolve inspect --json` prints
    con = sqlite3.connect(tmp_path / "a.db")
    assert y.completions == loop.stats.completions == con.execute("SELECT COUNT(*) FROM completions").fetchone()[0]
    cut = con.execute("SELECT COUNT(*) FROM completions WHERE finish_reason = 'length'").fetchone()[0]
    assert y.cut == loop.stats.cut == cut
    assert y.tokens == loop.stats.tokens > 0
    ok_children = con.execute(
        "SELECT COUNT(*) FROM programs p JOIN evaluations e ON e.program_id = p.id "
        "WHERE p.parent_id IS NOT NULL AND e.error_kind IS NULL"
    ).fetchone()[0]
    assert y.new_valid == loop.stats.new_valid == ok_children - y.quality.zero > 0
    assert y.quality == loop.stats.yields().quality and y.quality.evaluated >= ok_children  # live == stored
    assert y.beats_parent_per_1k_tokens == pytest.approx(1000 * y.quality.beats_parent / y.tokens)
    assert y.variants == 2 * y.completions  # m answers per completion, always
    assert 0 < y.per_completion <= 2 and y.per_1k_tokens == pytest.approx(1000 * y.new_valid / y.tokens)
    assert "yield" in loop.stats.summary()
    # the next prompt from the seed shows its two newest children, read from the archive (so a resume keeps them)
    seed = loop.population.first
    children = [c for (c,) in con.execute("SELECT code FROM programs WHERE parent_id = ? ORDER BY id", (seed.id,))]
    assert len(children) >= 2
    prompted = loop.sampler.prompt(seed, [], loop.members[0].base)
    edit_format, prompt = prompted.edit_format, prompted.text
    assert edit_format == "full"
    shown = prompt.split("# Recent children of the current program")[1].split("# Task")[0]
    body = [c.split("# EVOLVE-BLOCK-START\n")[1].split("# EVOLVE-BLOCK-END")[0].strip() for c in children[-2:]]
    assert all(b in shown for b in body) and shown.index(body[0]) < shown.index(body[1])
    # `recent_children` says how many: every child when it asks for more than there are, none at 0
    bodies = [c.split("# EVOLVE-BLOCK-START\n")[1].split("# EVOLVE-BLOCK-END")[0].strip() for c in children]
    loop.sampler.options = replace(options, recent_children=len(children) + 3)
    shown = loop.sampler.prompt(seed, [], loop.members[0].base).text.split("# Recent children")[1].split("# Task")[0]
    assert all(b in shown for b in bodies) and shown.count("```python\n") == len(children)
    loop.sampler.options = replace(options, recent_children=0)
    held = structured_by(loop.members[0].policy)  # as the loop asks, the answer held to its shape (on here)
    loop.sampler.options = replace(options, recent_children=0, structured="auto")
    unshown = loop.sampler.prompt(seed, [], loop.members[0].base, held)
    assert "# Recent children" not in unshown.text
    # the copy guard knows the parent and its newest children whether the prompt shows them or not
    parent_block = SQUARE_SEED.split("# EVOLVE-BLOCK-START\n")[1].split("# EVOLVE-BLOCK-END")[0].strip("\n")
    assert unshown.avoid[0] == parent_block and set(b.strip() for b in bodies) <= {b.strip() for b in unshown.avoid}
    # ...under `diff` too, whose answers may rewrite a block in a fence (edits stand outside fences: unguarded)
    assert loop.sampler.prompt(seed, [], replace(loop.members[0].base, edit_format="diff"), held).avoid == unshown.avoid
    sampling = [json.loads(s) for (s,) in con.execute("SELECT sampling FROM completions ORDER BY id")]
    assert {s["edit_format"] for s in sampling} == {"full"} and sampling[0]["template"] == "directed"
    asked = {
        (arm, json.loads(s)["template"], json.loads(s)["temperature"])
        for arm, s in con.execute("SELECT p.ask, c.sampling FROM completions c JOIN prompts p ON p.id = c.prompt_id")
    }
    arms = {"base": ("directed", 0.7), "hotter": ("directed", 0.9), "template": ("standard", 0.7)}
    assert ("base", "directed", 0.7) in asked
    assert all(arms[arm] == tuple(rest) for arm, *rest in asked)  # each group asked as its arm is recorded


def test_barren_groups_try_each_ask_arm_record_it_and_stall_keeping_tokens_and_m_answers(tmp_path):
    untaught = save_tiny(tmp_path / "untaught")  # writes noise: every variant is unparseable
    problem, archive, run, options = square_run(
        tmp_path, max_evaluations=50, max_new_tokens=24, stall_groups=3, asks="base,hotter,template,full"
    )
    loop = SearchLoop(problem, archive, TransformersPolicy.load(str(untaught)), ProcessSandbox(2), run, options)
    reason = run_search(loop)
    assert reason.startswith("stalled: 3 groups without a new child: 0% unchanged, 0% duplicate, 100% unparseable")
    assert "tried: asks base, hotter, template" in reason
    assert "\n" not in reason
    con = sqlite3.connect(tmp_path / "a.db")
    state = json.loads(con.execute("SELECT state FROM runs").fetchone()[0])
    assert {a: t["groups"] for a, t in state["ensemble"]["asks"].items()} == {"base": 1, "hotter": 1, "template": 1}
    assert state["stop_reason"] == reason  # the stall line is kept with the run
    rows = con.execute(
        "SELECT p.id, p.ask, c.sampling, c.token_ids, c.logprobs, "
        "(SELECT COUNT(*) FROM variants v WHERE v.completion_id = c.id) "
        "FROM completions c JOIN prompts p ON p.id = c.prompt_id ORDER BY c.id"
    ).fetchall()
    asked = {pid: (arm, json.loads(s)["template"], json.loads(s)["temperature"]) for pid, arm, s, *_ in rows}
    assert asked == {1: ("base", "directed", 0.7), 2: ("hotter", "directed", 0.9), 3: ("template", "standard", 0.7)}
    prompts = [t for (t,) in con.execute("SELECT text FROM prompts ORDER BY id")]
    assert "Variant 2: a different method" in prompts[0] and "Variant 2: a different method" not in prompts[2]
    for *_, ids, lps, m in rows:  # what the trainer needs survives every change of the ask
        assert len(ids) // 4 == len(lps) // 4 > 0 and m == 2
    inspect = subprocess.run(
        [sys.executable, "-m", "evolve.cli", "inspect", str(tmp_path / "a.db")], capture_output=True, text=True
    )
    assert "yield 0 new valid children: 0.00 per completion" in inspect.stdout
    assert "unparseable 100%" in inspect.stdout
    # noise runs to its 24-token budget: each such completion is counted as cut, live and from the archive
    cut = con.execute("SELECT COUNT(*) FROM completions WHERE finish_reason = 'length'").fetchone()[0]
    assert cut == loop.stats.cut == loop.stats.yields().cut > 0
    assert f"completions cut at the token budget {cut} ({cut / len(rows):.0%})" in inspect.stdout
    assert f"completions cut at the token budget {cut / len(rows):.0%}" in loop.stats.summary()
    assert "ask hotter: 1 groups (33% of all, 33% of the last 20)" in inspect.stdout


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
    assert [g.finish_reason for g in policy.generate("x", SamplingParams(0.8, 0.95, 10**6), 2)] == ["interrupted"] * 2
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


EXACT_SQUARE = "<variant 1>\n```python\ndef solve(x):\n    return x * x\n```\n</variant 1>"


class SolvesThenRambles:
    """The first group answers the square problem exactly; every later one is the endless model's, which only
    an interrupt ends. A composition of two real policies: the recorded answer and a real tiny model. With
    `finish_on_request`, the second call instead returns a normal group once the interrupt has been asked for:
    a solve landing just as the group finished."""

    max_concurrency = 1

    def __init__(self, endless: TransformersPolicy, finish_on_request: bool = False) -> None:
        self.endless, self.name, self.version, self.calls = endless, "solves-then-rambles", 0, 0
        self.finish_on_request = finish_on_request
        self.rambling, self.asked = threading.Event(), threading.Event()

    def generate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]:
        self.calls += 1
        if self.calls == 1:
            return [Generated(EXACT_SQUARE, None, None, "stop", self.version) for _ in range(n)]
        self.rambling.set()
        if self.finish_on_request:
            assert self.asked.wait(60)
            return [Generated(f"def solve(x):\n    return x + {i}", None, None, "stop", 0) for i in range(n)]
        return self.endless.generate(prompt, params, n)

    def interrupt(self) -> None:
        self.endless.interrupt()
        self.asked.set()

    def withdraw_interrupt(self) -> None:
        self.endless.withdraw_interrupt()

    def close(self) -> None:
        pass


def run_until_solved(tmp_path, policy, **options):  # type: ignore[no-untyped-def]
    """The square problem on one worker, scoring each child only once the second group is being sampled, so
    that the solve lands mid-generation; returns (stop reason, run options, archive connection)."""
    problem, archive, run, run_options = square_run(
        tmp_path, workers=1, max_evaluations=50, max_new_tokens=10**6, fit_tokens_to_code=False, **options
    )

    class ScoresOnceRambling(ProcessSandbox):
        def evaluate(self, problem, code):  # type: ignore[no-untyped-def]
            if code != problem.seed_code:
                policy.rambling.wait(60)
            return super().evaluate(problem, code)

    loop = SearchLoop(problem, archive, policy, ScoresOnceRambling(1), run, run_options)
    outcome: list[str] = []
    worker = threading.Thread(target=lambda: outcome.append(run_search(loop)), daemon=True)
    worker.start()
    worker.join(timeout=120)  # without the cut, the second group samples 10**6 tokens
    assert not worker.is_alive(), "the run kept sampling after the goal was reached"
    return outcome[0], run_options, sqlite3.connect(tmp_path / "a.db")


@pytest.mark.parametrize(
    ("goal", "reason"),
    [
        ({"stop_when_solved": True}, "solved: every component reached its best declared bound"),
        ({"target": 1.0}, "target 1.0 reached"),
    ],
)
def test_reaching_the_goal_ends_the_group_being_sampled(tmp_path, endless_model_dir, goal, reason):
    """The README demo kept sampling a whole group after its solve; now the group in flight is cut (not stored)
    while the queued children are still scored, and the policy's next call runs normally."""
    endless = TransformersPolicy.load(str(endless_model_dir))
    policy = SolvesThenRambles(endless)
    stopped, options, con = run_until_solved(tmp_path, policy, **goal)
    assert stopped == reason
    assert policy.calls == 2  # the second group was being sampled when the solve landed
    assert con.execute("SELECT COUNT(*) FROM completions").fetchone()[0] == options.group_size  # group 1 only
    assert con.execute("SELECT COUNT(*) FROM variants WHERE status = 'ok' AND program_id IS NULL").fetchone()[0] == 0
    assert con.execute("SELECT MAX(scalar) FROM evaluations").fetchone()[0] == 1.0
    normal = endless.generate("x", SamplingParams(0.8, 0.95, 5), 2)  # the interrupt was honoured and consumed
    assert [(g.finish_reason, len(g.token_ids or [])) for g in normal] == [("length", 5)] * 2


def test_a_group_that_finished_as_the_goal_landed_is_kept_and_the_request_withdrawn(tmp_path, endless_model_dir):
    """The interrupt is asked for while the call is in flight, but the call returns normally: its completions
    are stored (nothing is lost) and the unconsumed request must not end the policy's next call."""
    endless = TransformersPolicy.load(str(endless_model_dir))
    policy = SolvesThenRambles(endless, finish_on_request=True)
    stopped, options, con = run_until_solved(tmp_path, policy, stop_when_solved=True)
    assert stopped == "solved: every component reached its best declared bound"
    assert con.execute("SELECT COUNT(*) FROM completions").fetchone()[0] == 2 * options.group_size
    normal = endless.generate("x", SamplingParams(0.8, 0.95, 4), 2)
    assert [(g.finish_reason, len(g.token_ids or [])) for g in normal] == [("length", 4)] * 2


class SolvesThenAsksTheServer:
    """HTTP flavour of SolvesThenRambles: the second group is a request to a real loopback server over the
    endless model, which only a cancelled request (the loop's cut) stops waiting for."""

    max_concurrency = 1

    def __init__(self, http: object) -> None:
        self.http, self.name, self.version, self.calls = http, "solves-then-asks", 0, 0
        self.rambling = threading.Event()

    async def agenerate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]:
        self.calls += 1
        if self.calls == 1:
            return [Generated(EXACT_SQUARE, None, None, "stop", self.version) for _ in range(n)]
        self.rambling.set()
        return await self.http.agenerate(prompt, params, n)  # type: ignore[attr-defined]

    def generate(self, prompt: str, params: SamplingParams, n: int) -> list[Generated]:
        raise AssertionError("the loop samples an async policy through agenerate")

    def close(self) -> None:
        pass


def test_reaching_the_goal_cancels_the_request_in_flight(tmp_path, endless_model_dir):
    from policies.http_policy import HttpPolicy
    from tests.openai_server import LoopbackServer

    server = LoopbackServer(endless_model_dir).start()
    try:
        policy = SolvesThenAsksTheServer(HttpPolicy(server.url, server.model_name, max_wait_s=30))
        stopped, options, con = run_until_solved(tmp_path, policy, stop_when_solved=True)
        assert stopped == "solved: every component reached its best declared bound"
        assert policy.calls == 2
        assert con.execute("SELECT COUNT(*) FROM completions").fetchone()[0] == options.group_size
    finally:
        server.policy.interrupt()  # the server does not abort on a dropped connection: end its generation
        server.stop()
