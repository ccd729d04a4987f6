"""The live view shows what it is given, brackets and all, and nothing it has not measured."""

from __future__ import annotations

from rich.console import Console

from evolve.stats import LiveLines, LoopStats


def _render(stats: LoopStats, live: LiveLines | None = None) -> str:
    console = Console(width=220, record=True)
    console.print(stats.render(live or LiveLines()))
    return console.export_text()


def test_free_text_is_not_taken_for_markup():
    stats = LoopStats(["c0"], 10, None)
    waiting = LiveLines("waiting for http://127.0.0.1:9 (ConnectError: [Errno 111] Connection refused)")
    stats.last_train = "update failed (PolicyError: [x] bad); serving v0"
    out = _render(stats, waiting)
    assert "[Errno 111] Connection refused" in out and "[x] bad" in out


def test_rates_appear_only_once_measured():
    stats = LoopStats(["c0"], 10, None)
    assert "100%" not in _render(stats)
    stats.parse.update({"ok": 3, "parse_error": 1})
    stats.record_best(7, 0.5, {"c0": 0.5})
    out = _render(stats)
    assert "25%" in out and "0.5 (#7)" in out
