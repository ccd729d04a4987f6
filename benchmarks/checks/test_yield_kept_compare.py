"""benchmarks.yield_compare on archives kept by two real tiny runs of benchmarks.yield's `run_problem` (the real
loop, process sandbox and SQLite archives; replayed completions stand in for the model, so the figures are
known): before, the completions make a child at the worst value of both components and one that beats the
seed; after, two that beat it (both solve it: the second ties the first, so one new best)."""

from __future__ import annotations

import importlib
import re

from benchmarks import yield_compare
from evolve.problem.samples import FOUR, SQUARE, write_square_problem
from evolve.problem.samples import full_answer as answer
from policies.policy import Generated
from policies.replay import ReplayPolicy

_yield = importlib.import_module("benchmarks.yield")  # `yield` is a keyword
ZERO = "def solve(x):\n    return -1\n"
TOKENS = 50  # each replayed completion reports this many token ids, as a model's would


class CountedReplay(ReplayPolicy):
    """Replayed completions that carry token ids, so that the per-1k-token figures have tokens to divide by."""

    def generate(self, prompt, params, n):
        return [Generated(g.text, list(range(TOKENS)), None, "stop", 0) for g in super().generate(prompt, params, n)]


def keep(folder, problem, texts):
    policy = CountedReplay(texts)
    r = _yield.run_problem(problem, policy, "replay", 1, 120.0, 0, "process", folder, {"group_size": 1})
    policy.close()
    return r


def test_two_kept_folders_compare_per_problem_and_in_one_line(tmp_path, capsys):
    problem = write_square_problem(tmp_path / "square")
    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir(), after.mkdir()
    ran = keep(before, problem, [answer(ZERO, FOUR)])
    keep(after, problem, [answer(SQUARE, "def solve(x):\n    return x**2\n")])  # one new best: they tie
    assert ran.yields.quality.zero == 1 and ran.yields.new_valid == 1
    assert yield_compare.main([str(before), str(after)]) == 0
    out = capsys.readouterr().out
    *_, line, result = out.strip().splitlines()  # the improvement line, then the suite's result line
    assert result == "yield_compare problems_before=1 problems_after=1"
    read = yield_compare.kept_runs(before)["square"].yields
    assert read.quality == ran.yields.quality  # read back from the kept archive as the run counted it
    tokens_before, tokens_after = read.tokens, yield_compare.kept_runs(after)["square"].yields.tokens
    assert re.fullmatch(
        r"improvement beats_parent_per_1k_tokens_before=(\S+) after=(\S+) zero_share_before=50\.0% "
        r"after=0\.0% new_best_before=1 after=1",
        line,
    ), line
    assert tokens_before == tokens_after == TOKENS  # one group of one completion each
    assert line.startswith("improvement beats_parent_per_1k_tokens_before=20.000 after=40.000 ")
    assert "beats_parent" in out and "zero share" in out and "same behaviour" in out and "new bests" in out


def test_a_folder_without_archives_is_one_clear_line(tmp_path, capsys):
    assert yield_compare.main([str(tmp_path), str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("yield_compare: ") and "no archive with a run" in err and len(err.splitlines()) == 1
