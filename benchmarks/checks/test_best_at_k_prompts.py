"""benchmarks/best_at_k.py's fixed prompt set, and what a resumed run keeps of its measurements. The prompt
set: at least `--prompts` of them where the run made that many, even when a small model's search kept returning to
fewer parents (issue 36 asks for 8; the probe archives had 5 and 7). Each prompt is sampled as the run sampled it."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from benchmarks.best_at_k import Measured, kept_measurements, parents, pick_prompts, sampling_params


def test_each_parent_s_first_prompt_comes_first_then_later_prompts_fill_the_set():
    run = [("p1 a", 1), ("p1 b", 1), ("p2 a", 2), ("p1 c", 1), ("p3 a", 3), ("p2 b", 2), ("p1 c", 1)]
    assert pick_prompts(run, 3) == [("p1 a", 1), ("p2 a", 2), ("p3 a", 3)]
    five = pick_prompts(run, 5)
    assert five[:3] == [("p1 a", 1), ("p2 a", 2), ("p3 a", 3)]
    assert len(five) == len(set(five)) == 5 and set(five) <= set(run)
    assert sorted(pick_prompts(run, 99)) == sorted(set(run))  # never a prompt twice, never more than the run made
    assert pick_prompts([], 8) == []


def test_a_resumed_run_drops_measurements_of_another_adapter(tmp_path: Path) -> None:
    """A `--work` reused with other `--adapter`s: the old policy's figures must not stand in for the new one's."""
    rows = [
        Measured("none", "p", [[0.1]]),
        Measured("grpo", "p", [[0.2]], adapter="/old/grpo/v2"),
        Measured("vpo", "p", [[0.3]], adapter="/new/vpo/v16"),
        Measured("vpo", "q", [[0.4]]),  # written before the adapter was recorded: kept, as before
    ]
    kept = tmp_path / "measured.json"
    kept.write_text(json.dumps([asdict(r) for r in rows]))
    done = kept_measurements(kept, {"grpo": Path("/new/grpo/v16"), "vpo": Path("/new/vpo/v16")})
    assert sorted(done) == [("none", "p"), ("vpo", "p"), ("vpo", "q")]
    assert kept_measurements(tmp_path / "absent.json", {}) == {}


def test_each_prompt_is_sampled_as_the_run_sampled_it_its_answer_held_to_the_same_grammar(tmp_path: Path) -> None:
    """The loop holds a llama.cpp policy's answer to a grammar; best@k sampled the same prompts as free text, where
    the policies trained on held answers wrote `<variant 1>…</variant 1>` with their code outside the tags (0 and
    13 new valid variants of 288 against the untrained policy's 40). The group's stored settings, read back through
    a real archive, give the same decoding but the seed (and the copy guard's list: copies are counted here)."""
    from dataclasses import replace

    from evolve.archive import Archive, CompletionRecord, NewProgram
    from evolve.archive.records import EvaluationRecord
    from evolve.problem.samples import write_problem
    from policies.answer_grammar import AnswerShape
    from policies.policy import SamplingParams

    folder = write_problem(tmp_path / "sq")
    archive = Archive(tmp_path / "a.db")
    run = archive.create_run("sq", str(folder), "fp", {"options": {"max_new_tokens": 512}}, 0)
    evaluation = EvaluationRecord(
        scores={"c0": 0.5}, scalar=0.5, duration_s=0.01, error_kind=None, error=None, sandbox="check"
    )
    [(parent, _)] = archive.add_evaluated_programs(
        run.id, [NewProgram("def solve(x):\n    return x\n", None, 0, 0, None, evaluation)], False
    )
    shape = AnswerShape(3, "full", "python", "#", ("a.py", "lib/b.py"))
    sampled = SamplingParams(0.7, 0.9, 768, 12345, 40, ("</variant 3>",), shape, ("def solve(x): ...",))
    stored = {**sampled.as_dict(), "edit_format": "full", "template": "directed"}  # as the loop stores a group
    answer = [CompletionRecord("<variant 1>", None, None, "stop", None)]
    archive.add_group(
        run.id,
        parent_id=parent,
        inspiration_ids=[],
        island=0,
        prompt="P",
        sampling=stored,
        completions=answer,
        variants=[[("parse_error", "cut", None)]],
    )
    archive.close()
    _, [chosen], options = parents(tmp_path / "a.db", 8)
    assert sampling_params(chosen, options, 7) == replace(sampled, seed=7, avoid=())
