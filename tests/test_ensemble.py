"""Several policies in one run: a bandit gives the groups to the member whose groups bring new, better children;
`inspect --json` shows the allocation; a resume with a member added and one removed goes on, saying so once.

Real parts: replay members (no model), the process sandbox, a SQLite archive, the command-line app, and a real
`evolve serve` server."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner, Result

from evolve.bandit import Allocator, ArmView
from evolve.members import MemberError, MemberSpec, as_stored, parse_member
from evolve.options import RunOptions, RunOverrides
from evolve.problem import load_problem
from evolve.problem.samples import write_problem
from evolve.search import SearchSetupError, build_search

COUNT_TOML = """
name = "count"
description = "Return a larger number."
[program]
file = "seed.py"
entry_point = "solve"
[fitness]
components = [{ name = "n", bounds = [0.0, 1000.0] }]
[limits]
timeout_s = 5
memory_mb = 512
[search]
islands = 1
group_size = 1
variants = 1
edit_format = "full"
max_new_tokens = 64
"""
COUNT_EVAL = """
def cases():
    return [{"name": "n", "input": 0}]

def score(case, output):
    return float(min(max(output, 0), 1000))
"""
SEED = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return 1\n# EVOLVE-BLOCK-END\n"


def _answer(body: str) -> str:
    return f"<variant 1>\n```python\n{body}```\n</variant 1>\n"


@pytest.fixture(scope="module")
def count_setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """The problem folder, and replay members by role: `up` writes ever larger numbers (each a new, better
    child), `echo` returns the seed's code as it is, `other` writes numbers from another range."""
    root = tmp_path_factory.mktemp("ensemble")
    folder = write_problem(root / "count", seed=SEED, evaluate=COUNT_EVAL, toml=COUNT_TOML)
    files = {
        "up": [_answer(f"def solve(x):\n    return {k}\n") for k in range(2, 400)],
        "echo": [_answer("def solve(x):\n    return 1\n")],
        "other": [_answer(f"def solve(x):\n    return {k} // 2\n") for k in range(2, 400)],
    }
    specs = {}
    for role, texts in files.items():
        (root / f"{role}.json").write_text(json.dumps(texts))
        specs[role] = f"replay:{root / f'{role}.json'}"
    return folder, specs


def _cli(*args: str) -> Result:
    """The command-line app in this process (a subprocess would only import the engine again)."""
    from evolve.cli import app

    return CliRunner().invoke(app, list(args), catch_exceptions=False)


@pytest.mark.slow  # about 25 evaluations in the process sandbox: 10 s here
def test_the_bandit_gives_the_improving_member_two_thirds_and_a_resume_with_changed_members_goes_on(
    tmp_path, count_setup
):
    folder, spec = count_setup
    db = tmp_path / "a.db"
    problem = load_problem(folder)
    given = RunOverrides(sandbox="process", workers=2, max_evaluations=22, seed=3, stall_groups=50)
    search = build_search(problem, given, db=db, policies=[spec["up"], spec["echo"]])
    try:
        search.run()
    finally:
        search.close()
    inspect = _cli("inspect", str(db), "--json")
    assert inspect.exit_code == 0, inspect.output
    [summary] = json.loads(inspect.stdout)
    members = {m["name"]: m for m in summary["members"]}
    up, echo = members[spec["up"]], members[spec["echo"]]
    assert up["valid"] == 21 and up["improved"] > 0 and echo["valid"] == 0 and echo["copies"] == echo["groups"] > 0
    assert up["best_scalar"] is not None and echo["best_scalar"] is None
    assert abs(up["share"] + echo["share"] - 1.0) < 1e-9
    # after a warm-up of 6 groups, the improving member had at least two thirds of them
    order = summary["bandit"]["order"]
    assert order == [spec["up"], spec["echo"]]
    groups = [m for (m,) in _prompt_members(db)]
    after = groups[6:]
    assert len(after) >= 12 and after.count(spec["up"]) >= 2 * len(after) / 3, groups
    assert summary["bandit"]["members"][spec["echo"]]["groups"] == echo["groups"]  # the kept state agrees

    # resume with `echo` removed and `other` added: one line says so, the run goes on with the new member
    resumed = _cli(
        "run", str(folder), "--db", str(db), "--policy", spec["other"], "--policy", spec["up"],
        "--max-evaluations", "28", "--sandbox", "process",
    )  # fmt: skip
    assert resumed.exit_code == 0, resumed.output
    said = [line for line in resumed.stdout.splitlines() if line.startswith("ensemble:")]
    assert said[-1] == (
        f"ensemble: {spec['other']} added (starting from its prior); {spec['echo']} removed "
        "(its groups and record stay in the archive); 2 member(s) go on"
    )
    later = [m for (m,) in _prompt_members(db)][len(groups) :]
    assert later and spec["echo"] not in later and spec["other"] in later
    [again] = json.loads(_cli("inspect", str(db), "--json").stdout)
    assert again["bandit"]["order"] == [spec["other"], spec["up"]]
    assert again["bandit"]["members"][spec["echo"]]["groups"] == echo["groups"]  # its record is kept
    assert again["evaluations"] == 28


def _prompt_members(db: Path) -> list[tuple[str]]:
    import sqlite3

    with sqlite3.connect(db) as con:
        return con.execute("SELECT member FROM prompts ORDER BY id").fetchall()


def test_member_specs_parse_check_and_refuse_with_one_line(count_setup, tmp_path):
    hot = parse_member("embedded[temperature=1.1,template=standard,weight=2]")
    assert hot == MemberSpec("embedded", weight=2.0, temperature=1.1, template="standard")
    assert hot.name == "embedded[temperature=1.1,template=standard]"
    assert parse_member("vllm:http://[::1]:8000@m").spec == "vllm:http://[::1]:8000@m"  # brackets of a URL stay
    with pytest.raises(MemberError, match="two policy members are named 'embedded'"):
        as_stored(["embedded", "embedded[weight=3]"])
    with pytest.raises(MemberError, match="template 'fancy'; use one of standard, directed"):
        parse_member("embedded[template=fancy]")
    with pytest.raises(MemberError, match="unknown key"):
        parse_member("embedded[temp=1]")
    folder, spec = count_setup
    tabled = write_problem(
        tmp_path / "tabled",
        seed=SEED,
        evaluate=COUNT_EVAL,
        toml=COUNT_TOML + f'[[search.policies]]\nspec = "{spec["up"]}"\nweight = 3.0\n'
        f'[[search.policies]]\nspec = "{spec["echo"]}"\ntemperature = 1.1\nname = "hot"\n',
    )
    options = RunOptions.for_problem(load_problem(tabled).config.search)
    assert options.members() == [MemberSpec(spec["up"], weight=3.0), MemberSpec(spec["echo"], "hot", temperature=1.1)]
    assert options.policy == spec["up"]
    assert RunOptions.for_problem(
        load_problem(tabled).config.search, **RunOverrides(policy="embedded").given()
    ).members() == [MemberSpec("embedded")]  # --policy wins over the table
    with pytest.raises(SearchSetupError, match="asks 'base,colder': unknown arm"):
        build_search(
            load_problem(folder), RunOverrides(sandbox="process", asks="base,colder"), db=tmp_path / "b.db",
            policies=[spec["up"]],
        )  # fmt: skip
    bad = _cli("run", str(folder), "--db", str(tmp_path / "c.db"), "--policy", "embedded[weight=0]")
    assert bad.exit_code == 2 and "weight 0.0 must be > 0" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


def test_the_allocator_is_deterministic_keeps_a_floor_and_follows_value_per_cost():
    rich, poor = ArmView(1.0, 10, 1.0, 30.0), ArmView(1.0, 10, 1.0, 0.0)
    picks = [Allocator("bandit").choose([rich, poor], np.random.default_rng([5, i])) for i in range(200)]
    again = [Allocator("bandit").choose([rich, poor], np.random.default_rng([5, i])) for i in range(200)]
    assert picks == again and picks.count(0) > 190
    # the same value at ten times the cost is worth less: the cheap arm wins
    cheap, dear = ArmView(1.0, 10, 1.0, 10.0), ArmView(1.0, 10, 10.0, 10.0)
    assert [Allocator().choose([dear, cheap], np.random.default_rng(i)) for i in range(50)].count(1) > 45
    # an arm below its floor (10% of the groups) gets the next group, whatever its record
    starved = ArmView(1.0, 5, 1.0, 0.0)
    assert Allocator().choose([ArmView(1.0, 95, 1.0, 90.0), starved], np.random.default_rng(0)) == 1
    # every arm is warmed up first, in order; `uniform` takes turns; `weights` keeps the weights' shares
    assert Allocator().choose([rich, ArmView(1.0, 0, 0.0, 0.0)], np.random.default_rng(0)) == 1
    assert Allocator("uniform").choose([rich, ArmView(1.0, 9, 0.0, 0.0)], np.random.default_rng(0)) == 1
    heavy, light = ArmView(3.0, 6, 0.0, 0.0), ArmView(1.0, 2, 0.0, 0.0)
    assert Allocator("weights").choose([heavy, light], np.random.default_rng(0)) == 0  # 3:1 wants 6.75 : 2.25


def test_the_record_survives_a_resume_by_name_whatever_the_order_and_choices_repeat_under_a_seed():
    from dataclasses import asdict

    from evolve.ensemble import Ensemble, Tally

    a, b, c = MemberSpec("replay:a"), MemberSpec("replay:b"), MemberSpec("replay:c")

    def played(seed: int) -> tuple[Ensemble, list[tuple[int, str]]]:
        ensemble, picks = Ensemble([a, b], ["base", "hotter"], seed=seed), []
        for i in range(12):
            choice = ensemble.choose(i)
            name = ensemble.members[choice.member].name
            ensemble.settled(name, choice.ask)
            ensemble.sampled(name, choice.ask, 2, 100, 1.0, {"ok": 1, "unchanged": 1})
            if name == "replay:a":
                ensemble.credit(name, choice.ask, improved=True, new_best=i == 0, scalar=float(i), program_id=i)
            picks.append((choice.member, choice.ask))
        return ensemble, picks

    first, picks = played(7)
    assert played(7)[1] == picks  # the same seed and outcomes: the same choices
    assert first.tallies["replay:a"].valid == picks.count((0, "base")) + picks.count((0, "hotter"))
    state = first.state()
    swapped = Ensemble([b, a], ["base", "hotter"], state=state)
    assert swapped.changes == "ensemble: members reordered; each keeps its record (matched by name)"
    assert swapped.tallies == first.tallies
    changed = Ensemble([a, c], ["base"], state=state)
    assert changed.changes == (
        "ensemble: replay:c added (starting from its prior); replay:b removed (its groups and record stay in the "
        "archive); 2 member(s) go on"
    )
    assert changed.tallies["replay:c"] == Tally()
    kept = changed.state()["ensemble"]
    assert kept["members"]["replay:b"] == asdict(first.tallies["replay:b"])
    assert kept["order"] == ["replay:a", "replay:c"]
    assert kept["asks"]["hotter"] == asdict(first.ask_tallies["hotter"])  # an ask arm left out keeps its record too
    back = Ensemble([a, b, c], ["base", "hotter"], state=changed.state())  # listed again: its record comes back
    assert back.tallies["replay:b"] == first.tallies["replay:b"] and back.ask_tallies == first.ask_tallies
    assert Ensemble([a], ["base"], state={}).changes is None  # a new run has nothing to say
