"""Does training the policy in the loop help the search? The real `evolve run` machinery, three arms.

Same problem, same evaluation budget, same seeds; the arms differ only in what happens every `--train-every`
groups: nothing, a GRPO update, or a VPO update (this project's ArchiveTrainer: the adapter is saved, published
into the sampling policy and recorded as a policy version, exactly as `evolve run --train-every` does).

Two problems (`--task`), each fixed before its first run: `solve(x)` should equal a target on each of five
inputs (0, 2, 3, -2, 5); each input is one component, scored 1/(1 + |error|), so a program can be exactly right
on some inputs and far off on others. The policy is a tiny model taught, on the problem's own prompt shapes, a
few answers that pull apart, each exact on some inputs only; the target is never taught, so the search only gets
there by sampling something it was not taught.
- `square` (x * x): taught `x + x` (exact on 0 and 2), `x * 3` (0 and 3), `abs(x) * 2` (0, 2, -2), `x + 6` (3, -2),
  `4`, `x`, `x - 1`, `1`. The target is one token away from `x * 3`.
- `square_plus_x` (x * x + x), chosen after `square` proved too easy: taught `x * 3` (0, 2), `x * 4` (0, 3),
  `x * 6` (0, 5), `abs(x)` (0, -2), `6`, `12`, `x + x`. The target takes two untaught steps.

Reported per arm, mean ± std over seeds: the best scalar (mean component) in the archive at the budget; the
number of components some program has at its best bound (1.0); the archive's reward-space diversity (mean
pairwise distance between the score vectors of its valid programs); and the final policy's best@k on held-out
prompts (parents and feedback the run never showed it; k = completions x variants answers each, scored in the
same sandbox), averaged over those prompts. Settings (learning rate, rank, budget) are the same for every arm
and were set before the first run.
Usage: python -m benchmarks.search_with_training [--task square|square_plus_x] [--seeds 5]
"""

from __future__ import annotations

import argparse
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from evolve.archive import Archive
from evolve.fitness import scalar_view
from evolve.loop import SearchLoop, run_search
from evolve.options import RunOptions
from evolve.problem import Problem, load_problem
from evolve.prompts import PromptInputs, ShownProgram, build_prompt, completion_stop, parse_completion
from evolve.runs import open_run
from evolve.training import ArchiveTrainer
from policies.policy import SamplingParams
from policies.tiny import build_taught_model
from policies.trainer import TrainConfig
from policies.transformers_policy import TransformersPolicy
from sandboxes.process import ProcessSandbox


@dataclass(frozen=True)
class Task:
    """One problem of this benchmark: `solve(x)` should equal `target` on each input (one component each), and
    the tiny model is taught answer pairs that are each exact on some inputs only; `target` is never taught."""

    name: str
    description: str
    target: str
    inputs: tuple[int, ...]
    taught: tuple[tuple[str, str], ...]
    teaching_parents: tuple[str, ...]
    held_out_parents: tuple[str, ...] = ("x - 3", "2 * x + 1", "x // 2")

    def toml(self) -> str:
        components = ", ".join(f'{{ name = "c{i}", bounds = [0.0, 1.0] }}' for i in range(len(self.inputs)))
        return TOML.format(name=self.name, description=self.description, components=components)

    def evaluator(self) -> str:
        return EVALUATE.format(inputs=self.inputs, target=self.target)


TASKS = {
    # x * x is one token away from the taught `x * 3`: every arm solved it within 13 evaluations (docs/training.md)
    "square": Task(
        "pull_apart",
        "Return the square of x. Each input is one fitness component.",
        "x * x",
        (0, 2, 3, -2, 5),
        (
            ("x + x", "x * 3"),
            ("abs(x) * 2", "x + 6"),
            ("4", "x"),
            ("x - 1", "1"),
            ("x * 3", "4"),
            ("x + 6", "x + x"),
        ),
        ("x + 1", "x + x", "x * 3", "4", "abs(x) * 2", "x - 1"),
    ),
    # two untaught steps: `x * ` followed by `x`, then the tail of the taught `x + x`
    "square_plus_x": Task(
        "pull_apart_plus",
        "Return x squared plus x. Each input is one fitness component.",
        "x * x + x",
        (0, 2, 3, -2, 5),
        (
            ("x * 3", "x * 4"),
            ("abs(x)", "x * 6"),
            ("6", "x + x"),
            ("12", "x * 3"),
            ("x * 4", "abs(x)"),
            ("x * 6", "6"),
        ),
        ("x + 1", "x * 3", "x * 4", "6", "abs(x)", "x + x"),
    ),
}
TOML = """
name = "{name}"
description = "{description}"
[program]
file = "seed.py"
entry_point = "solve"
[fitness]
components = [{components}]
[limits]
timeout_s = 5
memory_mb = 512
[search]
islands = 2
migration_interval = 4
"""
EVALUATE = """
INPUTS = {inputs!r}

def cases():
    return [{{"name": f"c{{i}}", "input": x, "expected": {target}}} for i, x in enumerate(INPUTS)]

def score(case, output):
    if isinstance(output, bool) or not isinstance(output, (int, float)):
        return 0.0, "not a number: " + repr(output)[:200]
    return 1.0 / (1.0 + abs(output - case["expected"])), f"solve({{case['input']}}) = {{output!r}}"
"""
SEED = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return x + 1\n# EVOLVE-BLOCK-END\n"
ARMS = ("none", "grpo", "vpo")
VARIANTS, GROUP_SIZE = 2, 4
MAX_GROUPS = 60


def program(expr: str) -> str:
    return SEED.replace("x + 1", expr)


def write_problem(root: Path, task: Task) -> Problem:
    root.mkdir(parents=True, exist_ok=True)
    (root / "problem.toml").write_text(task.toml())
    (root / "evaluate.py").write_text(task.evaluator())
    (root / "seed.py").write_text(SEED)
    return load_problem(root)


def prompt(task: Task, parent: str, scores: dict[str, float], feedback: str | None, others: list[ShownProgram]) -> str:
    return build_prompt(PromptInputs(task.description, program(parent), scores, feedback, others, VARIANTS, "full"))


def teaching_pairs(task: Task) -> list[tuple[str, str]]:
    """Each taught completion after many prompt shapes the loop makes (parents, scores, feedback, inspirations)."""
    parents, n = task.teaching_parents, len(task.inputs)
    prompts = []
    for i, parent in enumerate(parents):
        scores = {f"c{j}": round(((i + j) % 3) / 3, 3) for j in range(n)}
        feedback = None if i == 0 else "\n".join(f"c{j}: solve({x}) = {i + x}" for j, x in enumerate(task.inputs))
        others = [
            ShownProgram(program(parents[(i + k) % len(parents)]), {"c0": 1.0, "c1": 0.2}) for k in range(1, 1 + i % 3)
        ]
        prompts.append(prompt(task, parent, scores, feedback, others))
    pairs = []
    for i, answers in enumerate(task.taught):
        completion = "".join(
            f"<variant {k}>\n```python\ndef solve(x):\n    return {expr}\n```\n</variant {k}>\n"
            for k, expr in enumerate(answers, start=1)
        )
        pairs += [(prompts[(i + j) % len(prompts)], completion) for j in range(len(prompts))]
    return pairs


def held_out_prompts(task: Task) -> list[str]:
    out = []
    for i, parent in enumerate(task.held_out_parents):
        scores = {f"c{j}": round(0.1 * ((i * 7 + j) % 5), 3) for j in range(len(task.inputs))}
        feedback = "\n".join(f"c{j}: solve({x}) = {x - 3 + i}" for j, x in enumerate(task.inputs))
        out.append(prompt(task, parent, scores, feedback, [(program("x * 2 - 1"), {"c2": 0.5})]))
    return out


def archive_figures(db: Path, problem: Problem) -> tuple[float, int, float, int]:
    """(best scalar, components at their best bound, mean pairwise distance of valid score vectors, evaluations
    stored when the first program at every bound was, or all of them when none is)."""
    import json

    con = sqlite3.connect(db)
    stored = [(json.loads(s), e) for s, e in con.execute("SELECT scores, error_kind FROM evaluations ORDER BY id")]
    con.close()
    rows = [r for r, error in stored if error is None]
    at_bounds = [i for i, (r, error) in enumerate(stored) if error is None and r and min(r.values()) >= 1.0]
    to_solve = at_bounds[0] + 1 if at_bounds else len(stored)
    names = [c.name for c in problem.components]
    vectors = np.array([[float(r.get(n, 0.0)) for n in names] for r in rows]) if rows else np.zeros((0, len(names)))
    best = max((scalar_view(problem.components, r) for r in rows), default=0.0)
    solved = int((vectors >= 1.0).any(axis=0).sum()) if len(vectors) else 0
    pairs = list(combinations(range(len(vectors)), 2))
    diversity = float(np.mean([np.linalg.norm(vectors[a] - vectors[b]) for a, b in pairs])) if pairs else 0.0
    return best, solved, diversity, to_solve


def best_at_k(policy: TransformersPolicy, task: Task, problem: Problem, sandbox: ProcessSandbox, seed: int) -> float:
    """Mean over held-out prompts of the best scalar among the k = GROUP_SIZE x VARIANTS answers sampled."""
    bests = []
    for p, text in enumerate(held_out_prompts(task)):
        params = SamplingParams(0.7, 0.95, 200, 90_000 + seed * 100 + p, stop=completion_stop(VARIANTS))
        best = 0.0
        for g in policy.generate(text, params, GROUP_SIZE):
            for v in parse_completion(program(task.held_out_parents[p]), g.text, VARIANTS):
                if v.code is not None:
                    outcome = sandbox.evaluate(problem, v.code)
                    if outcome.error_kind is None:
                        best = max(best, scalar_view(problem.components, outcome.scores))
        bests.append(best)
    return float(np.mean(bests))


def run_arm(
    task: Task, arm: str, seed: int, model_dir: Path, work: Path, budget: int, train_every: int, lr: float
) -> dict:
    torch.manual_seed(seed)
    problem = write_problem(work / "problem", task)
    archive = Archive(work / "a.db")
    options = RunOptions(
        workers=2,
        group_size=GROUP_SIZE,
        variants=VARIANTS,
        max_evaluations=budget,
        edit_format="full",
        temperature=0.7,
        max_new_tokens=200,  # two taught answers take ~150 byte-level tokens
        stall_groups=0,  # the arms differ in training only: the budget alone ends a run, and the ask never
        asks="base",  # changes (the taught model knows only the directed prompt)
        max_groups=MAX_GROUPS,  # a safety net, the same for every arm
        seed=seed,
        train_every=train_every if arm != "none" else 0,
        train_method=arm if arm != "none" else "vpo",
    )
    run = open_run(archive, problem, options).run
    policy = TransformersPolicy.load(str(model_dir))
    sandbox = ProcessSandbox(slots=2)
    step = None
    if arm != "none":
        config = TrainConfig(method=arm, learning_rate=lr, lora_rank=8, lora_alpha=16, seed=seed)
        trainer = ArchiveTrainer(archive, run.id, list(problem.components), VARIANTS, policy, config, work / "adapters")
        step = trainer.step
    loop = SearchLoop(problem, archive, policy, sandbox, run, options, step)
    reason = run_search(loop)
    best, solved, diversity, to_solve = archive_figures(work / "a.db", problem)
    return {
        "best": best,
        "solved": solved,
        "diversity": diversity,
        "to_solve": to_solve,
        "best@k": best_at_k(policy, task, problem, sandbox, seed),
        "updates": loop.stats.train_updates,
        "failures": loop.stats.train_failures,
        "groups": loop.stats.groups,
        "reason": reason,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--task", choices=sorted(TASKS), default="square")
    ap.add_argument("--budget", type=int, default=40, help="evaluations per run")
    ap.add_argument("--train-every", type=int, default=1, help="groups between updates (GRPO and VPO arms)")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "vpo-evolve-bench")
    args = ap.parse_args()
    torch.set_num_threads(1)
    started = time.time()
    task = TASKS[args.task]
    model_dir = build_taught_model(args.cache, teaching_pairs(task), steps=500)
    print(f"taught model ready ({time.time() - started:.0f}s)", flush=True)
    results: dict[str, list[dict]] = {a: [] for a in ARMS}
    for seed in range(args.seeds):
        for arm in ARMS:
            with tempfile.TemporaryDirectory() as tmp:
                row = run_arm(task, arm, seed, model_dir, Path(tmp), args.budget, args.train_every, args.lr)
            results[arm].append(row)
            print(f"seed {seed} {arm}: {row} ({time.time() - started:.0f}s)", flush=True)
    k = GROUP_SIZE * VARIANTS
    table = Table(
        title=f"search with training: {task.target} ({args.seeds} seeds, {args.budget} evaluations, update every "
        f"{args.train_every} group(s), lr {args.lr}; mean ± std over seeds)"
    )
    columns = ("arm", "best scalar", "components solved", "evaluations to solve (or made)", "archive diversity")
    for col in (*columns, f"held-out best@{k}", "updates", "groups"):
        table.add_column(col, justify="left" if col == "arm" else "right")

    def cell(rows: list[dict], key: str) -> str:
        vals = [r[key] for r in rows]
        return f"{np.mean(vals):.3f}±{np.std(vals):.3f}"

    for arm, rows in results.items():
        keys = ("best", "solved", "to_solve", "diversity", "best@k", "updates", "groups")
        table.add_row(arm, *(cell(rows, key) for key in keys))
    Console(width=160).print(table)
    print(f"elapsed {time.time() - started:.0f}s")

    def ms(arm: str, key: str) -> str:
        vals = [r[key] for r in results[arm]]
        return f"{np.mean(vals):.3f}±{np.std(vals):.3f}"

    print(
        "search_with_training "
        + " ".join(f"{arm}={ms(arm, 'best')}" for arm in ARMS)
        + " solved "
        + " ".join(f"{arm}={ms(arm, 'solved')}" for arm in ARMS)
        + " evaluations_to_solve "
        + " ".join(f"{arm}={ms(arm, 'to_solve')}" for arm in ARMS)
        + " best@k "
        + " ".join(f"{arm}={ms(arm, 'best@k')}" for arm in ARMS)
    )


if __name__ == "__main__":
    main()
