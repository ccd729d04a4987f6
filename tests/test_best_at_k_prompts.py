"""benchmarks/best_at_k.py's fixed prompt set: at least `--prompts` of them where the run made that many, even
when a small model's search kept returning to fewer parents (issue 36 asks for 8; the probe archives had 5 and 7)."""

from __future__ import annotations

from benchmarks.best_at_k import pick_prompts


def test_each_parent_s_first_prompt_comes_first_then_later_prompts_fill_the_set():
    run = [("p1 a", 1), ("p1 b", 1), ("p2 a", 2), ("p1 c", 1), ("p3 a", 3), ("p2 b", 2), ("p1 c", 1)]
    assert pick_prompts(run, 3) == [("p1 a", 1), ("p2 a", 2), ("p3 a", 3)]
    five = pick_prompts(run, 5)
    assert five[:3] == [("p1 a", 1), ("p2 a", 2), ("p3 a", 3)]
    assert len(five) == len(set(five)) == 5 and set(five) <= set(run)
    assert sorted(pick_prompts(run, 99)) == sorted(set(run))  # never a prompt twice, never more than the run made
    assert pick_prompts([], 8) == []
