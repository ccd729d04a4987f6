"""Hostile model output parses in linear time, within a deadline, and never holds a run up (red-team finding 2).

A heading line followed by 1,000 spaces took 1.8 s to parse, 3,000 spaces 47 s, and `<<<<<<< SEARCH` followed by
100,000 `=` 32 s: patterns that tried a run of characters in every way it could be split, inside one `re` call
that held the GIL (so Ctrl-C waited too). Each hostile input here is parsed at 1 KB to 64 KB, for a parent of one
block, of two blocks and of two files, with one variant asked and three: each doubling of the input may at most
about double the time (3x, for noise; times under 5 ms are not compared), and no parse may take a quarter of a
second. The parser's own deadline is lifted for these (`PARSE_SECONDS`), so that it cannot hide a slow rule by
cutting it short; it is tested by itself below, as are the size cap and the run's interrupt.
"""

from __future__ import annotations

import gc
import math
import re
import time
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolve.filetree import join_files
from evolve.prompts import parse_completion
from evolve.prompts import parser as parser_module

PARENT = (
    "import math\n\n# EVOLVE-BLOCK-START\ndef solve(x):\n    y = x + 1\n    return y\n# EVOLVE-BLOCK-END\n\n\n"
    'def helper():\n    return "outside"\n'
)
TWO_BLOCKS = (
    "a = 0\n# EVOLVE-BLOCK-START\nb = 1\n# EVOLVE-BLOCK-END\nc = 2\n# EVOLVE-BLOCK-START\nd = 3\n# EVOLVE-BLOCK-END\n"
)
TREE = join_files(
    [
        ("main.py", "from lib.a import solve\n\nprint(solve(2))\n"),
        ("lib/a.py", "# EVOLVE-BLOCK-START\ndef solve(x):\n    y = x + 1\n    return y\n# EVOLVE-BLOCK-END\n"),
    ]
)
PARENTS = {"one block": PARENT, "two blocks": TWO_BLOCKS, "two files": TREE}
DIFF = "<<<<<<< SEARCH\n    y = x + 1\n=======\n    y = x * 2\n>>>>>>> REPLACE"

SIZES = [1024 << k for k in range(7)]  # 1 KB to 64 KB
# Times are this thread's CPU time (the machine's other work, which takes the core away, does not count), the
# least of three runs (what still varies, caches and the like, only ever adds time).
REPEATS = 3
RETRIES = 2  # a doubling that looks too slow is timed again, with more runs, before it fails the test
# Times under this are noise, not compared: on two loaded cores (a sibling hyperthread busy) the same linear rule
# measured 3.6 ms at 2 KB and 15.4 ms at 4 KB, then 2x per doubling alone. A superlinear rule still crosses it
# within a doubling or two, and MOST_S bounds the largest.
FLOOR_S = 0.02
GROWTH = 3.0  # a doubled input may take at most this many times as long
MOST_S = 0.25  # no parse of at most 64 KB may take longer (the old rules took minutes)


def fill(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


HOSTILE: dict[str, Callable[[int], str]] = {
    "spaces": lambda n: fill(" ", n),
    "tabs": lambda n: fill("\t", n),
    "spaces and tabs": lambda n: fill(" \t", n),
    "blank lines": lambda n: fill(" \n", n),
    "heading, then spaces": lambda n: "### Variant 1\n" + fill(" ", n),
    "heading, then spaces and tabs": lambda n: "### Variant 1\n" + fill(" \t", n),
    "heading padded with spaces": lambda n: "### Variant 1" + fill(" ", n),
    "headings repeated": lambda n: fill("### Variant 1   \t \n**Variant 2**  \n// variant 3\t\t\n", n),
    "equals": lambda n: fill("=", n),
    "less-thans": lambda n: fill("<", n),
    "greater-thans": lambda n: fill(">", n),
    "backticks": lambda n: fill("`", n),
    "SEARCH, then equals": lambda n: "<<<<<<< SEARCH\n" + fill("=", n),
    "SEARCH, then equals and a newline": lambda n: "<<<<<<< SEARCH\n" + fill("=", n) + "\n",
    "SEARCH markers, then spaces": lambda n: "<<<<<<<" + fill(" ", n) + "x",
    "SEARCH markers repeated": lambda n: fill("<<<<<<< SEARCH\n", n),
    "SEARCH markers on one line": lambda n: fill("<<<<<<< SEARCH ", n),
    "dividers repeated": lambda n: "<<<<<<< SEARCH\n    y = x + 1\n" + fill("=======\n", n),
    "closing markers repeated": lambda n: "<<<<<<< SEARCH\n    y = x + 1\n=======\n" + fill(">>>>>>> ", n),
    "edits repeated": lambda n: fill(DIFF + "\n", n),
    "variant tags repeated": lambda n: fill("<variant 1>", n),
    "variant tags unclosed": lambda n: fill("<variant 2>\n```python\n", n),
    "variant tag, then spaces": lambda n: "<variant" + fill(" ", n) + "1",
    "closing tags, then spaces": lambda n: fill("</ variant      \n<  variant  ", n),
    "fence opener, then spaces": lambda n: "```" + fill(" ", n) + "y",
    "python fence, then spaces": lambda n: "```python" + fill(" ", n) + "y",
    "fence openers repeated": lambda n: fill("```python  \t \n", n),
    "fence, then brackets": lambda n: "```python\n" + fill("([{", n),
    "file header padded": lambda n: "=== FILE: lib/a.py ===" + fill(" ", n) + "y",
    "header-like line": lambda n: "==FILE:x" + fill(" ", n) + "y",
    "file headers repeated": lambda n: fill("=== FILE: lib/a.py ===\n", n),
    "bare path, spaces before": lambda n: fill(" ", n) + "lib/a.py x",
    "bare paths repeated": lambda n: fill("**lib/a.py:**\n", n),
    "markers in fences": lambda n: fill("# EVOLVE-BLOCK-END\n```\n", n),
    # bare code that Python parses statement by statement (a red team's: one ast.parse of 256 KB took 1.5 s)
    "short statements": lambda n: fill("a\n", n),
    "if statements": lambda n: fill("if a:a\n", n),
    "tuple lines": lambda n: "(" + fill("x,\n", n) + ")",
}


@pytest.fixture(scope="module", autouse=True)
def frozen_heap() -> Iterator[None]:
    """What the suite made before this module is set aside from the collector (`gc.freeze`): each timing begins
    with a collection, and one over the whole suite's heap made the module 4x slower (93 s against 24 s, with
    1.5 million objects held), none of it the parser's."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(autouse=True)
def no_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rules themselves are timed here: the parser's deadline would cut a slow one short and hide it."""
    monkeypatch.setattr(parser_module, "PARSE_SECONDS", math.inf, raising=False)


def best_time(run: Callable[[], object], repeats: int = REPEATS) -> float:
    best = math.inf
    gc.disable()
    try:
        for _ in range(repeats):
            start = time.thread_time()
            run()
            best = min(best, time.thread_time() - start)
            if best > MOST_S:  # far past linear: timing it again (or a larger one) only delays the failure
                break
    finally:
        gc.enable()
    return best


def assert_linear(name: str, job: Callable[[int], Callable[[], object]], sizes: list[int] = SIZES) -> None:
    """`job(n)` timed at each size: each doubling at most GROWTH times slower, none slower than MOST_S. A doubling
    that looks too slow is timed again (both sizes) before it counts: the machine's other work comes in bursts,
    and a rule that is really superlinear is just as slow the second time."""
    gc.collect()
    times: list[tuple[int, float]] = []
    for n in sizes:
        took = best_time(job(n))
        times.append((n, took))
        for retry in range(RETRIES):
            if len(times) < 2 or times[-1][1] < FLOOR_S or times[-1][1] <= GROWTH * max(times[-2][1], FLOOR_S):
                break
            if times[-1][1] > MOST_S:
                break
            repeats = REPEATS * (retry + 2)
            times[-2:] = [(k, min(t, best_time(job(k), repeats))) for k, t in times[-2:]]
        shown = ", ".join(f"{k // 1024} KB {t * 1000:.1f} ms" for k, t in times)
        assert times[-1][1] < MOST_S, f"{name} is slow: {shown}"
        if len(times) > 1 and times[-1][1] >= FLOOR_S:
            assert times[-1][1] <= GROWTH * max(times[-2][1], FLOOR_S), f"{name} grows faster than its input: {shown}"


def completion(hostile: str, m: int) -> str:
    """One variant: the hostile text as the whole answer. Three: a sound first variant, the hostile text after."""
    if m == 1:
        return hostile
    return f"<variant 1>\n{DIFF}\n</variant 1>\n<variant 2>\n{hostile}"


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_completions_parse_in_linear_time(kind: str) -> None:
    make = HOSTILE[kind]
    for parent_name, parent in PARENTS.items():
        for m in (1, 3):

            def job(n: int, parent: str = parent, m: int = m) -> Callable[[], object]:
                text = completion(make(n), m)
                return lambda: parse_completion(parent, text, m, multi_file=parent is TREE)

            assert_linear(f"{kind} ({parent_name}, m={m})", job)
            variants = parse_completion(parent, completion(make(SIZES[-1]), m), m, multi_file=parent is TREE)
            assert [v.slot for v in variants] == list(range(m))


def test_hostile_program_text_is_read_in_linear_time_by_the_prompt_and_block_rules() -> None:
    """A child's code is model output too, read again by the next prompt: its language telltales and the names
    its blocks define (a C program of many blank lines took 3 s per prompt to tell its fence tag)."""
    from evolve.prompts.block_match import defined_names
    from evolve.prompts.builder import PromptInputs

    for kind in ("blank lines", "spaces and tabs", "headings repeated", "fence, then brackets"):

        def job(n: int, kind: str = kind) -> Callable[[], object]:
            code = HOSTILE[kind](n) + "\nint main(void) { return 0; }\n"
            inputs = PromptInputs("p", code, {}, None, [], 1, "full")
            return lambda: (inputs.fence_tag, defined_names(code))

        assert_linear(kind, job)


LARGEST = 64 * 1024  # MAX_COMPLETION_CHARS: the most text any of these patterns is given from one completion
REGEX_MOST_S = 0.05  # one call on the largest text: a few ms on an idle machine, this on a loaded one


def test_no_single_regex_call_holds_the_gil_for_long_on_the_largest_completion() -> None:
    """Ctrl-C's handler runs only between the main thread's bytecodes, and a worker thread inside one `re` call
    keeps the GIL: every pattern that reads model output, on 64 KB of each hostile input, returns within
    milliseconds, and so does the whole edit scan."""
    from evolve.filetree import _HEADER
    from evolve.problem.blocks import _MARKER
    from evolve.prompts import block_match, builder, edit_scan, parse_limits, tree_edits

    assert parse_limits.MAX_COMPLETION_CHARS == LARGEST
    patterns = {
        "tag": parser_module._TAG,
        "heading": parser_module._HEADING,
        "fence line": parser_module._FENCE_LINE,
        "python fence": parser_module._FENCE,
        "any fence": parser_module._ANY_FENCE,
        "lead comment": parser_module._LEAD,
        "file header": tree_edits._NAMED,
        "defined names": block_match._DEFINES,
        "openers": edit_scan._OPENERS,
        "closers": edit_scan._CLOSERS,
        "dividers": edit_scan._DIVIDERS,
        "EVOLVE markers": _MARKER,
        "joined-file headers": _HEADER,
        **{f"{tag} telltale": telltale for tag, telltale in builder.TELLTALES},
    }
    slow = []
    for kind, make in HOSTILE.items():
        text = make(LARGEST)
        calls = {name: (lambda p=pattern, text=text: p.findall(text)) for name, pattern in patterns.items()}
        calls["the edit scan"] = lambda text=text: edit_scan.find_edits(text)
        for name, call in calls.items():
            took = best_time(call, 1)
            if took > REGEX_MOST_S:  # timed once; again, as the least of several, only when that looked slow
                took = min(took, best_time(call))
            if took > REGEX_MOST_S:
                slow.append(f"{name} on {kind}: {took * 1000:.0f} ms")
    assert not slow, slow


# The pattern the edit scan replaced, kept here as the reference for what an answer's edits are.
OLD_EDIT = re.compile(
    r"<{5,9}\s*SEARCH[^\n]*\n((?:(?!<{5,9}\s*SEARCH).)*?)\n?={5,9}[^\n]*\n(.*?)"
    r"(?:\n?>{5,9}\s*REPLACE[^\n]*|(?=<{5,9}\s*SEARCH)|\Z)",
    re.S,
)
PIECES = ["<", "<<<<<", "<<<<<<<", "<" * 10, ">", ">>>>>", ">>>>>>>", ">" * 10, "=", "=====", "=======", "=" * 10]
PIECES += ["SEARCH", " SEARCH", "REPLACE", " REPLACE", "\n", "\n", " ", "\t", "\x0c", "\u2028", "x", "y = 1"]


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=40).map("".join))
def test_the_edit_scan_reads_exactly_what_the_old_pattern_read(text: str) -> None:
    from evolve.prompts.edit_scan import find_edits

    assert find_edits(text) == OLD_EDIT.findall(text)


@pytest.mark.parametrize("parent", list(PARENTS.values()), ids=list(PARENTS))
@pytest.mark.parametrize("m", [1, 3])
def test_a_completion_past_the_deadline_is_not_read(parent: str, m: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deterministic: a deadline of no time at all is spent at the first check."""
    text = completion(DIFF, m)
    given = parse_completion(parent, text, m, multi_file=parent is TREE, seconds=0.0)
    monkeypatch.setattr(parser_module, "PARSE_SECONDS", 0.0)  # the named limit, as the loop's calls use it
    for parsed in (given, parse_completion(parent, text, m, multi_file=parent is TREE)):
        assert [(v.slot, v.status, v.code) for v in parsed] == [(k, "parse_error", None) for k in range(m)]
        assert {v.detail for v in parsed} == {"parsing took longer than 0 s of CPU time; the completion is not read"}
    assert parse_completion(PARENT, text, m, seconds=60.0)[0].status == "ok"


def test_a_completion_over_the_size_cap_is_not_read() -> None:
    from evolve.prompts.parse_limits import MAX_COMPLETION_CHARS

    text = DIFF + "\n" + " " * MAX_COMPLETION_CHARS
    for parent in PARENTS.values():
        parsed = parse_completion(parent, text, 2, multi_file=parent is TREE)
        assert [v.status for v in parsed] == ["parse_error", "parse_error"]
        assert parsed[0].detail == (
            f"the completion holds {len(text):,} characters, over the {MAX_COMPLETION_CHARS:,} read; it is not read"
        )
    assert parse_completion(PARENT, text[:MAX_COMPLETION_CHARS], 1)[0].status == "ok"


def test_a_completion_over_the_line_cap_is_not_read() -> None:
    """Short lines are what make Python's own parser slow (one `ast.parse` of 256 KB of `a` lines took 1.5 s, and
    nothing can interrupt it), so lines are capped as well as characters."""
    from evolve.prompts.parse_limits import MAX_COMPLETION_LINES

    text = DIFF + "\n" * (MAX_COMPLETION_LINES - DIFF.count("\n"))  # one line over
    parsed = parse_completion(PARENT, text, 1)
    assert [(v.status, v.detail) for v in parsed] == [
        (
            "parse_error",
            f"the completion holds {MAX_COMPLETION_LINES + 1:,} lines, over the "
            f"{MAX_COMPLETION_LINES:,} read; it is not read",
        )
    ]
    assert parse_completion(PARENT, text[:-1], 1)[0].status == "ok"


def test_the_deadline_is_checked_per_edit_and_an_interrupt_ends_the_parse() -> None:
    """The run's interrupt flag is asked at every check: once per edit at least, so a parse of thousands of edits
    stops within one edit of Ctrl-C; the caller (the group sampler) drops the group."""
    from evolve.group_sampler import parse_texts
    from evolve.prompts import ParseInterrupted

    asked = 0

    def never() -> bool:
        nonlocal asked
        asked += 1
        return False

    chain = "<<<<<<< SEARCH\n    y = x + {}\n=======\n    y = x + {}\n>>>>>>> REPLACE"
    many = "\n".join(chain.format(k, k + 1) for k in range(1, 201))  # each edit applies to the last one's result
    for parent in (PARENT, TREE):
        asked = 0
        assert parse_completion(parent, many, 1, multi_file=parent is TREE, stop=never)[0].status == "ok"
        assert asked >= 200
    with pytest.raises(ParseInterrupted):
        parse_completion(PARENT, many, 1, stop=lambda: True)
    with pytest.raises(ParseInterrupted):
        parse_texts(PARENT, [DIFF, many], 1, stop=lambda: True)
    assert parse_texts(PARENT, [DIFF], 1)[0][0].variant.status == "ok"


def test_an_interrupt_while_a_group_is_parsed_drops_the_group_and_ends_the_resume(tmp_path) -> None:
    """The loop hands the sampler its interrupt flag: Ctrl-C during the parse stores nothing of the group (as a
    cut during sampling), and during a resume's parsing leaves the variants not reached pending."""
    import asyncio
    import sqlite3

    from evolve.archive import code_hash
    from evolve.handoffs import Child
    from evolve.loop import SearchLoop
    from policies.replay import ReplayPolicy
    from sandboxes.process import ProcessSandbox
    from tests.helpers import SQUARE_SEED, square_run

    square = "<variant 1>\n```python\ndef solve(x):\n    return x * x\n```\n</variant 1>\n"
    problem, archive, run, options = square_run(tmp_path, group_size=1, variants=1)
    loop = SearchLoop(problem, archive, ReplayPolicy([square, square]), ProcessSandbox(slots=1), run, options)
    try:
        assert loop.sampler.interrupted == loop.control.signals.interrupt_requested
        member = loop.members[0]

        async def groups():
            seed = Child(SQUARE_SEED, None, 0, 0, None, code_hash(SQUARE_SEED))
            await loop.flow.commit([await loop.evaluator.score_seed(seed)])
            loop.sampler.interrupted = lambda: True  # Ctrl-C once sampling is done, while the group is parsed
            cut = await loop.group(0, member, member.base)
            loop.sampler.interrupted = loop.control.signals.interrupt_requested
            return cut, await loop.group(1, member, member.base)

        cut, stored = asyncio.run(groups())
        assert cut is None and stored is not None and len(stored.children) == 1
        assert sqlite3.connect(tmp_path / "a.db").execute("SELECT COUNT(*) FROM prompts").fetchone()[0] == 1
        resumed = SearchLoop(problem, archive, ReplayPolicy(["-"]), loop.sandbox, run, options)
        resumed.ledger.replay(resumed.writer.replay())
        resumed.sampler.interrupted = lambda: True
        assert list(resumed.sampler.resumed()) == []
        assert len(archive.pending_variants(run.id)) == 1  # still pending, for the next resume
    finally:
        loop.sandbox.close()
        archive.close()
