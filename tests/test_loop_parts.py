"""The loop's parts through their own interfaces: one group (replayed completions, a real SQLite archive) sampled,
admitted by the ledger and stored; the evaluation workers (a real process sandbox; no committer running, so what
they hand on stays in the results queue) and the committer (a real archive), each wired as `SearchLoop` wires
them, and what each record did to the run's ledger."""

from __future__ import annotations

import asyncio
import sqlite3

from evolve.archive import code_hash
from evolve.handoffs import Child
from evolve.loop import SearchLoop, run_search
from evolve.problem.samples import FOUR, SQUARE
from evolve.problem.samples import full_answer as answer
from policies.replay import ReplayPolicy
from sandboxes.process import ProcessSandbox
from tests.helpers import SQUARE_SEED, square_run


def wired(tmp_path, texts: list[str], **options) -> SearchLoop:
    problem, archive, run, run_options = square_run(tmp_path, **options)
    return SearchLoop(problem, archive, ReplayPolicy(texts), ProcessSandbox(slots=2), run, run_options)


def block(code: str) -> str:
    return f"# EVOLVE-BLOCK-START\n{code}# EVOLVE-BLOCK-END\n"


def child(code: str, parent_id: int | None = 1, island: int = 0) -> Child:
    return Child(code, parent_id, island, 0 if parent_id is None else 1, None, code_hash(code))


def test_the_group_sampler_stores_a_group_and_returns_only_new_children(tmp_path):
    """A group of 2 completions x 2 variants: a new program, the seed unchanged, and the new program twice more.
    The group and its variant rows land in the archive; only the new program comes back, once, as a child whose
    variant id is its stored row; a second identical group makes no child and stores its variants as duplicates."""
    loop = wired(tmp_path, [answer(SQUARE, "def solve(x):\n    return x + 1\n"), answer(SQUARE, SQUARE)], group_size=2)
    try:

        async def two_groups():
            seed = await loop.evaluator.score_seed(child(SQUARE_SEED, None))
            await loop.flow.commit([seed])
            return [await loop.group(i, loop.members[0], loop.members[0].base) for i in (0, 1)]

        first, second = asyncio.run(two_groups())
        assert first is not None and second is not None
        assert [c.code for c in first.children] == [block(SQUARE)]
        assert first.parent.id == loop.population.first.id and first.children[0].generation == 1
        assert first.statuses == {"ok": 1, "unchanged": 1, "duplicate": 2}
        assert second.children == [] and second.statuses == {"unchanged": 1, "duplicate": 3}
        con = sqlite3.connect(tmp_path / "a.db")
        rows = con.execute("SELECT id, status, program_id FROM variants ORDER BY id").fetchall()
        assert len(rows) == 8 and con.execute("SELECT COUNT(*) FROM prompts").fetchone()[0] == 2
        assert [r for r in rows if r[1] == "ok"] == [(first.children[0].variant_id, "ok", None)]  # pending
        assert [r[1:] for r in rows[:4]] == [
            ("ok", None),
            ("unchanged", None),
            ("duplicate", None),
            ("duplicate", None),
        ]
        pending = loop.archive.pending_variants(loop.run.id)
        assert [(p.variant_id, p.slot, p.parent_id) for p in pending] == [(first.children[0].variant_id, 0, 1)]
        # a later session (the run killed before the child was scored) parses the pending variant again
        resumed = SearchLoop(loop.problem, loop.archive, ReplayPolicy(["-"]), loop.sandbox, loop.run, loop.options)
        resumed.ledger.replay(resumed.writer.replay())
        again = list(resumed.sampler.resumed())
        assert [(r.code, r.pending.variant_id, r.pending.island) for r in again] == [
            (block(SQUARE), first.children[0].variant_id, 0)
        ]
        assert resumed.ledger.admit_resumed(again[0].code) == first.children[0].digest  # not known: a child again
    finally:
        loop.sandbox.close()
        loop.archive.close()


def test_a_cut_before_sampling_stores_nothing(tmp_path):
    loop = wired(tmp_path, [answer(SQUARE, FOUR)], group_size=1)
    try:

        async def cut_then_group():
            await loop.flow.commit([await loop.evaluator.score_seed(child(SQUARE_SEED, None))])
            loop.control.cut_sampling()
            return await loop.group(0, loop.members[0], loop.members[0].base)

        assert asyncio.run(cut_then_group()) is None
        assert sqlite3.connect(tmp_path / "a.db").execute("SELECT COUNT(*) FROM prompts").fetchone()[0] == 0
    finally:
        loop.sandbox.close()
        loop.archive.close()


def test_the_evaluation_workers_score_children_within_the_budget_and_leave_the_rest_pending(tmp_path):
    """Three children, a budget of two: the workers score two (their exact vectors), hand them on as results, and
    leave the third untouched; nothing is in flight afterwards."""
    loop = wired(tmp_path, [answer(SQUARE, FOUR)], max_evaluations=2, workers=2)
    codes = [block(SQUARE), block(FOUR), block("def solve(x):\n    return 9\n")]
    try:

        async def drain():
            workers = [asyncio.create_task(loop.flow.evaluate()) for _ in range(2)]
            for code in codes:
                await loop.flow.put(child(code))
            await loop.flow.queue.join()
            for w in workers:
                w.cancel()
            return [loop.flow.results.get_nowait() for _ in range(loop.flow.results.qsize())]

        results = asyncio.run(drain())
        scored = {r.child.code: r.outcome.scores for r in results}
        assert scored == {codes[0]: {"c0": 1.0, "c1": 1.0}, codes[1]: {"c0": 1.0, "c1": 0.0}}
        assert all(r.started_at <= r.finished_at for r in results)
        assert loop.control.reserved == 2 and loop.flow.busy == 0 and loop.flow.backlog == 2
    finally:
        loop.sandbox.close()
        loop.archive.close()


def test_the_commit_stage_stores_typed_evaluations_counts_new_programs_and_stops_at_the_target(tmp_path):
    """Results of the sandbox become program rows with their evaluation; a repeat of stored code gives its
    evaluation back to the budget; a child at the target ends the run and cuts the sampling."""
    loop = wired(tmp_path, [answer(SQUARE, FOUR)], target=1.0)
    try:

        async def commit_all():
            again = block(FOUR).replace("return 4", "return  4  # again")  # the same normalised code
            for one in (child(SQUARE_SEED, None), child(block(FOUR)), child(block(SQUARE)), child(again, island=1)):
                assert loop.ledger.reserve()
                await loop.flow.commit([await loop.evaluator.score_seed(one)])

        asyncio.run(commit_all())
        con = sqlite3.connect(tmp_path / "a.db")
        rows = con.execute(
            "SELECT p.code, e.scalar, e.error_kind, e.sandbox FROM programs p JOIN evaluations e "
            "ON e.program_id = p.id ORDER BY p.id"
        ).fetchall()
        assert [(r[1], r[2], r[3]) for r in rows] == [
            (0.0, None, "process"),
            (0.5, None, "process"),
            (1.0, None, "process"),
        ]
        assert loop.stats.evaluations == 3 and loop.stats.new_valid == 2 and loop.control.reserved == 3
        assert loop.control.reason == "target 1.0 reached" and loop.control.sampling_cut.is_set()
        assert loop.population.best is not None and loop.population.best.scalar == 1.0
    finally:
        loop.sandbox.close()
        loop.archive.close()


# Writes a log of STDERR_NOISE bytes first, then the traceback of the error it raises: the traceback is the tail.
STDERR_NOISE = 12 * 1024
LOUD_CRASH = f"""import sys, traceback
def solve(x):
    sys.stderr.write("FIRST-BYTES-OF-THE-LOG\\n" + "noise\\n" * ({STDERR_NOISE} // 6))
    try:
        raise ValueError("the-last-line-of-the-traceback")
    except ValueError:
        traceback.print_exc()
        raise
"""


def test_the_stored_stderr_is_the_tail_where_the_traceback_is(tmp_path):
    """More than STORED_OUTPUT bytes of stderr, then a traceback: the archive keeps the last 8 KiB (the prompt of a
    child of this program shows them), so the traceback's last line is there and the log's first bytes are not."""
    from evolve.commit import STORED_OUTPUT

    loop = wired(tmp_path, [answer(SQUARE, FOUR)])
    try:

        async def score_and_commit():
            result = await loop.evaluator.score_seed(child(block(LOUD_CRASH), None))
            assert result is not None and len(result.outcome.stderr) > STORED_OUTPUT + 1024, len(result.outcome.stderr)
            await loop.flow.commit([result])

        asyncio.run(score_and_commit())
        con = sqlite3.connect(tmp_path / "a.db")
        [(pid, stderr, error_kind)] = con.execute(
            "SELECT e.program_id, e.stderr, e.error_kind FROM evaluations e"
        ).fetchall()
        assert error_kind == "crash", error_kind
        assert len(stderr) == STORED_OUTPUT, len(stderr)
        assert stderr.rstrip().endswith("ValueError: the-last-line-of-the-traceback"), stderr[-300:]
        assert "FIRST-BYTES-OF-THE-LOG" not in stderr
        assert loop.archive.parent_context(pid).stderr == stderr  # what a child's prompt is shown
    finally:
        loop.sandbox.close()
        loop.archive.close()


def distinct_answers(count: int, first: int) -> list[str]:
    """Completions whose variants are all new programs (each wrong on one input of its own)."""
    bodies = [f"def solve(x):\n    return x * x if x != {first + i} else 0\n" for i in range(2 * count)]
    return [answer(bodies[2 * i], bodies[2 * i + 1]) for i in range(count)]


def test_a_resume_leaves_the_variants_of_earlier_groups_as_they_were(tmp_path):
    """A run stopped at its budget and resumed with a larger one: the variants stored before the resume keep their
    status and program (only a pending one, never evaluated, may change: it is evaluated or found a duplicate).
    Resume once relabelled every evaluated variant `duplicate`, which no loop or soak test noticed."""
    from dataclasses import replace

    loop = wired(tmp_path, distinct_answers(8, 100), group_size=2, max_evaluations=5, workers=2)
    try:
        assert run_search(loop) == "evaluation budget reached"
        con = sqlite3.connect(tmp_path / "a.db")
        query = "SELECT id, status, program_id FROM variants ORDER BY id"
        before = con.execute(query).fetchall()
        pending = [row for row in before if row[1] == "ok" and row[2] is None]
        settled = [row for row in before if row not in pending]
        assert sum(1 for row in settled if row[1] == "ok") >= 4, before  # evaluated children (the seed is none)
        budget = replace(loop.options, max_evaluations=9)
        policy = ReplayPolicy(distinct_answers(8, 200))
        resumed = SearchLoop(loop.problem, loop.archive, policy, loop.sandbox, loop.run, budget)
        assert run_search(resumed) == "evaluation budget reached"
        after = {row[0]: row[1:] for row in con.execute(query)}
        assert [(i, *after[i]) for i, _, _ in settled] == settled
        assert any(after[i][1] is not None for i, _, _ in pending), after  # the resume evaluated pending children
    finally:
        loop.sandbox.close()
        loop.archive.close()
