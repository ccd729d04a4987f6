"""The ask: prompts that insist on change, the edit format chosen from the code, the ask arms the bandit chooses
among, the stall that ends a run of barren groups and its line, and the parent's recent children."""

from __future__ import annotations

import pytest

from evolve.ask_arms import Ask, AskError, apply_arm, ask_arms
from evolve.prompts import PromptInputs, build_prompt, parse_completion, resolve_edit_format
from evolve.stopping import Stall
from evolve.yields import Yield

SHORT = "import math\n# EVOLVE-BLOCK-START\ndef solve(x):\n    return x + 1\n# EVOLVE-BLOCK-END\n"
LONG = "# EVOLVE-BLOCK-START\n" + "".join(f"v{i} = {i}\n" for i in range(60)) + "# EVOLVE-BLOCK-END\n"


def _prompt(**kw: object) -> str:
    base: dict[str, object] = dict(
        description="Square the input.",
        parent_code=SHORT,
        parent_scores={"c0": 0.0},
        parent_feedback=None,
        inspirations=[],
        variants=3,
        edit_format="auto",
    )
    return build_prompt(PromptInputs(**{**base, **kw}))  # type: ignore[arg-type]


def test_auto_edit_format_rewrites_short_code_and_diffs_long_code():
    assert resolve_edit_format("auto", SHORT) == "full"
    assert resolve_edit_format("auto", LONG) == "diff"
    assert resolve_edit_format("diff", SHORT) == "diff" and resolve_edit_format("full", LONG) == "full"
    assert "fenced block holding the complete new editable code" in _prompt()
    assert "SEARCH" in _prompt(parent_code=LONG) and "fenced block holding" not in _prompt(parent_code=LONG)


def test_prompt_insists_on_change_and_shows_recent_children_of_the_parent():
    recent = [SHORT.replace("x + 1", "x * 3"), SHORT.replace("x + 1", "x - 7")]
    text = _prompt(recent=recent)
    assert "Every variant must change the code" in text
    assert "differ from each other and from the recent children above" in text
    assert "# Recent children of the current program" in text
    assert text.index("return x * 3") < text.index("return x - 7") < text.index("# Your answer")
    assert "import math" not in text  # only the editable blocks are shown, for recent children too
    assert "Recent children" not in _prompt() and "recent children above" not in _prompt()
    # a recent attempt longer than the cap is cut, so one long child cannot crowd out the problem
    huge = "# EVOLVE-BLOCK-START\n" + "x = 1\n" * 2000 + "# EVOLVE-BLOCK-END\n"
    assert len(_prompt(recent=[huge])) < len(_prompt()) + 1600


def test_directed_template_gives_each_variant_its_own_kind_of_change():
    text = _prompt(template="directed")
    for k in (1, 2, 3):
        assert f"- Variant {k}: " in text
    assert "a different method or algorithm" in text
    assert "Variant 1:" not in _prompt(template="standard")


def _barren(stall: Stall, groups: int, statuses: dict[str, int]) -> None:
    """Feed `groups` barren groups (nothing pending) to the stall."""
    for _ in range(groups):
        assert stall.observe(False, False, statuses)


def test_copies_stall_with_one_line_naming_what_was_tried_and_what_is_asked():
    stall = Stall(6)
    copies = {"unchanged": 10, "duplicate": 2}
    _barren(stall, 5, copies)
    assert not stall.stalled
    assert stall.why() == "5 groups without a new child: 83% unchanged, 17% duplicate, 0% unparseable"
    _barren(stall, 1, copies)
    assert stall.stalled
    now = Ask("full", 1.0, "directed").describe()
    line = stall.message("asks base, hotter, template", now)
    assert line.startswith("stalled: 6 groups without a new child: 83% unchanged")
    assert "tried: asks base, hotter, template; now asking for full edits, temperature 1, directed prompt" in line
    assert "\n" not in line and "keeps copying" in line and "--stall-groups" in line


def test_unparseable_answers_stall_with_a_line_that_says_so():
    stall = Stall(2)
    _barren(stall, 1, {"apply_error": 9, "unchanged": 1})
    _barren(stall, 1, {"parse_error": 3})
    assert stall.stalled and "do not parse" in stall.message("", "x")


def test_a_new_child_resets_the_streak():
    stall = Stall(3)
    _barren(stall, 2, {"unchanged": 6})
    assert not stall.observe(True, False, {"ok": 1, "unchanged": 5})
    assert stall.barren == 0 and not stall.statuses
    _barren(stall, 2, {"unchanged": 6})
    assert not stall.stalled  # the streak started again from zero


def test_a_barren_group_with_children_still_pending_does_not_count():
    stall = Stall(2)
    assert not stall.observe(False, True, {"unchanged": 3})  # its parents-to-be may unblock the policy
    assert stall.barren == 0 and stall.statuses["unchanged"] == 3
    assert stall.observe(False, False, {"unchanged": 3}) and stall.barren == 1 and not stall.stalled


def test_ask_arms_turn_one_knob_each_from_the_members_own_settings_and_heat_is_capped():
    base = Ask("diff", 0.8, "standard", 0.9)
    assert apply_arm("base", base) == base
    assert apply_arm("hotter", base) == Ask("diff", 1.0, "standard", 0.9)
    assert apply_arm("template", base) == Ask("diff", 0.8, "directed", 0.9)
    assert apply_arm("full", base) == Ask("full", 0.8, "standard", 0.9)
    assert apply_arm("hotter", Ask("full", 1.2, "directed")).temperature == 1.3
    assert ask_arms("hotter, full") == ["base", "hotter", "full"]  # base is always an arm, first
    with pytest.raises(AskError, match="unknown arm"):
        ask_arms("base,colder")


def test_recent_children_come_from_the_archive_newest_two_oldest_first(tmp_path):
    from evolve.archive import Archive
    from tests.helpers import store_program

    archive = Archive(tmp_path / "a.db")
    run = archive.create_run("p", str(tmp_path), "x" * 64, {"problem": {}, "options": {}}, 0)
    ok = dict(scores={"c0": 1.0}, scalar=1.0, error_kind=None, error=None, duration_s=0.1, sandbox="process")
    seed, _ = store_program(archive, run.id, SHORT, evaluation=ok)
    for k in (2, 3, 4):
        code = SHORT.replace("x + 1", f"x * {k}")
        store_program(archive, run.id, code, parent_id=seed, generation=1, evaluation=ok)
    assert [c.split("return ")[1].split("\n")[0] for c in archive.recent_children(seed, 2)] == ["x * 3", "x * 4"]
    assert archive.recent_children(seed + 100, 2) == []


def test_yield_shares_and_rates():
    y = Yield(
        completions=4,
        tokens=2000,
        new_valid=3,
        statuses={"ok": 4, "unchanged": 4, "duplicate": 2, "parse_error": 1, "apply_error": 1},
    )
    assert y.per_completion == 0.75 and y.per_1k_tokens == 1.5
    assert (y.unchanged, y.duplicate, y.unparseable) == (4 / 12, 2 / 12, 2 / 12)
    assert y.line().startswith("0.00 beating their parent per 1k tokens")  # the headline first (issue 59)
    assert "; 0.75 new valid children per completion, 1.50 per 1k tokens; variants unchanged 33%" in y.line()
    assert Yield().per_completion == 0.0 and Yield().unparseable == 0.0


def test_parser_marks_an_echoed_parent_unchanged():
    echo = f"<variant 1>\n```python\n{SHORT.split('START')[1].split('# EVOLVE')[0].strip()}\n```\n</variant 1>"
    assert parse_completion(SHORT, echo, 1)[0].status == "unchanged"


def test_live_view_and_summary_show_yield_and_the_current_ask():
    from rich.console import Console

    from evolve.stats import LoopStats

    stats = LoopStats(["c0"], 10, None)
    stats.completions, stats.tokens, stats.new_valid = 4, 1000, 2
    stats.parse.update({"ok": 3, "unchanged": 6, "duplicate": 1, "parse_error": 2})
    stats.ask = "embedded: full edits, temperature 1, directed prompt (hotter)"
    stats.arms = ["ask hotter: 3 groups (60%), 2 new valid, 1 improved, 4 copies, 0.50/1k tokens"]
    assert "0.50 new valid children per completion, 2.00 per 1k tokens; variants unchanged 50%" in stats.summary()
    console = Console(width=200, record=True)
    console.print(stats.render())
    text = console.export_text()
    assert "0.50 valid/completion, 2.00/1k tokens" in text and "unchanged 50%, duplicate 8%, unparseable 17%" in text
    assert "embedded: full edits, temperature 1, directed prompt (hotter)" in text
    assert "ask hotter: 3 groups (60%), 2 new valid, 1 improved, 4 copies" in text


def test_zero_means_never_for_the_stall():
    """A benchmark that compares something else lets only its budget end the run."""
    stall = Stall(0)
    for _ in range(50):
        stall.observe(False, False, {"unchanged": 3})
    assert stall.barren == 50 and not stall.stalled
