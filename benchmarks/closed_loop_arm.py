"""One arm of `benchmarks/closed_loop.py`: a real search on one problem and seed for a fixed number of groups,
with no training or with GRPO or VPO updates every few groups, and what it is measured by.

The arm is `evolve run`'s own machinery (SearchLoop, the process sandbox, a SQLite archive, ArchiveTrainer
publishing each LoRA version into the llama.cpp sampler). Its budget is in groups (`max_groups`), the same for
every arm, so the answer does not depend on how busy or fast the machine is (on a CPU an update's seconds measure
the hardware, not the method); wall time per part is reported beside it. An arm resumes from its archive: run
again on the same folder, the loop goes on from its last group, the trainer from its newest adapter.
"""

from __future__ import annotations

import sqlite3
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from evolve.archive import Archive
from evolve.fitness import oriented_array, oriented_bounds, scalar_bounds, signs
from evolve.loop import SearchLoop, run_search
from evolve.options import RunOptions
from evolve.problem import Problem, load_problem
from evolve.runs import open_run
from evolve.search import train_config
from evolve.training import ArchiveTrainer, restore_latest_adapter
from evolve.yields import worst_values
from policies.from_spec import make_policy
from policies.policy import Policy
from policies.trainer import never
from sandboxes.backends import make_sandbox

HELD_OUT_SEED = 10_000  # + the arm's seed: every arm's final policy answers the same held-out draws


@dataclass(frozen=True)
class ArmSettings:
    """What every arm shares (sampling settings come from each problem's own `[search]`)."""

    policy: str = "llama:embedded"
    groups: int = 16  # the budget of every arm
    update_every: int = 1  # groups between updates of the trained arms
    learning_rate: float = 1e-4  # LoRA: about ten times a full fine-tune's 1e-5, one Adam step per update
    lora_rank: int = 8
    skip_zero_advantage: bool = True
    lazy_penalty: float = -0.5
    reward_normalisation: str = "group"
    epochs: int = 1  # PPO passes over each update's batch (issue 61: several, so that the clip acts)
    kl_coef: float = 0.0  # a KL term to the base model in each update (0: none)
    workers: int = 2
    held_out_groups: int = 1  # k = groups x G x m answers of the final policy on the held-out problem; 0: none
    # None: the problem's own (the study's). Set only for a smoke run, so that a tiny model's group takes seconds.
    max_new_tokens: int | None = None
    group_size: int | None = None


@dataclass
class ArmResult:
    problem: str
    arm: str
    seed: int
    seed_scalar: float
    best_scalar: float
    best_ratio: float  # best / seed: the headline figure
    curve: list[float]  # best/seed after each group
    valid_per_group: list[int]  # new valid children each group brought
    new_valid: int
    tokens: int
    valid_per_1k_tokens: float
    copy_share: float  # variants that echoed the parent or repeated a known program
    diversity: float
    groups: int
    updates: int
    update_failures: int
    held_out_ratio: float | None = None  # best of the final policy's k answers on the held-out problem / its seed
    held_out_k: int = 0
    reason: str = ""
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per part
    code: str = ""  # the commit the arm ran (closed_loop.code_version): the arms of one study share one


class _TimedPublisher:
    """The sampler seen through the trainer: each publish (GGUF export + adapter load) is timed."""

    def __init__(self, inner: Any, seconds: dict[str, float]) -> None:
        self.inner, self.seconds = inner, seconds

    def publish(self, adapter_dir: Any, version: int) -> None:
        started = time.monotonic()
        try:
            self.inner.publish(adapter_dir, version)
        finally:
            self.seconds["publish"] += time.monotonic() - started

    def serve_base(self, version: int) -> None:
        self.inner.serve_base(version)


class TimedTrainer(ArchiveTrainer):
    """ArchiveTrainer with its parts timed: the whole step, the adapter save and the publish."""

    def __init__(self, *args: Any, seconds: dict[str, float], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seconds = seconds
        self.publisher = _TimedPublisher(self.publisher, seconds)  # type: ignore[assignment]

    def step(self, should_stop: Callable[[], bool] = never) -> Any:
        started = time.monotonic()
        try:
            return super().step(should_stop)
        finally:
            self.seconds["update_step"] += time.monotonic() - started

    def _save_into(self, directory: Path) -> None:
        started = time.monotonic()
        try:
            super()._save_into(directory)
        finally:
            self.seconds["save"] += time.monotonic() - started


def arm_options(problem: Problem, arm: str, seed: int, s: ArmSettings) -> RunOptions:
    """The same options for every arm but the training ones; the ask is fixed and only the group budget ends a
    run (a solved problem too: an arm that solves it early keeps its best)."""
    return RunOptions.for_problem(
        problem.config.search,
        problem.config.training,
        workers=s.workers,
        max_evaluations=10**9,
        max_groups=s.groups,
        seed=seed,
        policy=s.policy,
        sandbox="process",
        stall_groups=0,  # the arms differ in training alone: no arm stops early for barren groups
        asks="base",  # ... and no arm changes how it asks
        train_every=s.update_every if arm != "none" else 0,
        train_method=arm if arm != "none" else "vpo",
        learning_rate=s.learning_rate,
        skip_zero_advantage=s.skip_zero_advantage,
        lazy_penalty=s.lazy_penalty,
        reward_normalisation=s.reward_normalisation,
        train_epochs=s.epochs,
        kl_coef=s.kl_coef,
        max_new_tokens=s.max_new_tokens,  # None: the problem's own
        group_size=s.group_size,
    )


def run_arm(folder: Path, arm: str, seed: int, s: ArmSettings, work: Path, held_out: Path | None) -> ArmResult:
    """Run (or resume, from `work/arm.db`) one arm to its group budget, and measure it."""
    seconds: dict[str, float] = defaultdict(float)
    started = time.monotonic()
    problem = load_problem(folder)
    work.mkdir(parents=True, exist_ok=True)
    archive = Archive(work / "arm.db")
    options = arm_options(problem, arm, seed, s)
    opened = open_run(archive, problem, options)
    run, resumed = opened.run, opened.resumed
    policy = make_policy(s.policy)
    if resumed:  # the sampler serves the newest version again; ArchiveTrainer takes its weights up itself
        restore_latest_adapter(archive, run.id, policy)
    sandbox = make_sandbox("process", workers=s.workers)
    step = None
    if arm != "none":
        config = replace(train_config(options), lora_rank=s.lora_rank, lora_alpha=2 * s.lora_rank, seed=seed)
        components = list(problem.components)
        trainer = TimedTrainer(
            archive, run.id, components, options.variants, policy, config, work / "adapters", seconds=seconds
        )
        step = trainer.step
    seconds["load"] = time.monotonic() - started
    # The loop takes each training member's step by name: the arm's one policy is the run's one member
    train_steps = {} if step is None else {options.members()[0].name: step}
    loop = SearchLoop(problem, archive, policy, sandbox, run, options, train_steps=train_steps)
    started = time.monotonic()
    reason = run_search(loop)
    if loop.control.interrupted.is_set():  # Ctrl-C or SIGTERM: the arm is not done; its archive resumes it
        policy.close()
        sandbox.close()
        archive.close()
        raise KeyboardInterrupt(f"{folder.name} {arm} seed {seed} interrupted: {reason}")
    seconds["search_wall"] = time.monotonic() - started
    summary = archive.summarize(run, signs(problem.components), worst_values(problem.components))
    archive.close()
    result = _figures(work / "arm.db", problem, run.id)
    seconds["sampling"] = float(summary.telemetry.get("generation_s") or 0.0)
    seconds["update"] = seconds["update_step"] - seconds["save"] - seconds["publish"]
    result = replace(
        result,
        problem=problem.name,
        arm=arm,
        seed=seed,
        tokens=int(summary.telemetry.get("tokens") or 0),
        valid_per_1k_tokens=float(summary.yields.get("per_1k_tokens") or 0.0),
        new_valid=int(summary.yields.get("new_valid") or 0),
        copy_share=float(summary.yields.get("unchanged") or 0.0) + float(summary.yields.get("duplicate") or 0.0),
        groups=len(result.curve),
        updates=len(archive_versions(work / "arm.db", run.id)),
        update_failures=loop.stats.train_failures,
        reason=reason,
    )
    if held_out is not None and s.held_out_groups > 0:
        started = time.monotonic()
        result.held_out_ratio, result.held_out_k = held_out_best(policy, held_out, seed, s, work)
        seconds["held_out"] = time.monotonic() - started
    result.seconds = {k: round(v, 1) for k, v in seconds.items()} | {"evaluation": result.seconds["evaluation"]}
    policy.close()
    sandbox.close()
    return result


def held_out_best(policy: Policy, folder: Path, seed: int, s: ArmSettings, work: Path) -> tuple[float, int]:
    """The final policy's best answer among k on a problem it never trained on, over that problem's seed: a
    fresh run from the seed for `held_out_groups` groups, no training, the same sampling draws for every arm."""
    problem = load_problem(folder)
    archive = Archive(work / "held_out.db")
    options = replace(
        arm_options(problem, "none", HELD_OUT_SEED + seed, s),
        max_groups=s.held_out_groups,
        stop_when_solved=False,
    )
    run = open_run(archive, problem, options).run
    sandbox = make_sandbox("process", workers=s.workers)
    run_search(SearchLoop(problem, archive, policy, sandbox, run, options))
    sandbox.close()
    archive.close()
    con = sqlite3.connect(work / "held_out.db")
    rows = con.execute(
        "SELECT p.parent_id, e.scalar, e.error_kind FROM programs p JOIN evaluations e ON e.program_id = p.id "
        "WHERE p.run_id = ? ORDER BY e.id",
        (run.id,),
    ).fetchall()
    answers = con.execute(
        "SELECT count(*) FROM variants v JOIN completions c ON c.id = v.completion_id JOIN prompts p "
        "ON p.id = c.prompt_id WHERE p.run_id = ?",
        (run.id,),
    ).fetchone()[0]
    con.close()
    seed_scalar = next((r[1] for r in rows if r[0] is None), None) or float("nan")
    children = [r[1] for r in rows if r[0] is not None and r[2] is None and r[1] is not None]
    return (max(children) / seed_scalar if children else 0.0), int(answers)


def archive_versions(db: Path, run_id: int) -> list[int]:
    """The trained policy versions of a run (a resumed arm counts those of every sitting)."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT number FROM policy_versions WHERE run_id = ? AND adapter_path IS NOT NULL", (run_id,)
        ).fetchall()
    finally:
        con.close()
    return [n for (n,) in rows]


def _figures(db: Path, problem: Problem, run_id: int) -> ArmResult:
    """Best/seed at the budget and after each group, new valid children per group, and the archive's diversity:
    the mean pairwise distance between the valid programs' score vectors, each scaled to [0, 1] by its bounds."""
    import json

    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT p.id, p.parent_id, e.scores, e.scalar, e.error_kind, e.duration_s "
        "FROM programs p JOIN evaluations e ON e.program_id = p.id WHERE p.run_id = ? ORDER BY e.id",
        (run_id,),
    ).fetchall()
    made_by = dict(  # each program's group: the first prompt whose completion proposed it
        con.execute(
            "SELECT v.program_id, min(c.prompt_id) FROM variants v JOIN completions c ON c.id = v.completion_id "
            "WHERE v.program_id IS NOT NULL GROUP BY v.program_id"
        ).fetchall()
    )
    prompts = [i for (i,) in con.execute("SELECT id FROM prompts WHERE run_id = ? ORDER BY id", (run_id,))]
    con.close()
    seed = next(r for r in rows if r[1] is None)
    seed_scalar = float(seed[3])
    valid = [r for r in rows if r[4] is None and r[3] is not None]
    best = max(float(r[3]) for r in valid)
    group_of = {prompt: i for i, prompt in enumerate(prompts)}
    per_group: list[list[float]] = [[] for _ in prompts]
    for r in valid:
        if r[1] is not None and made_by.get(r[0]) in group_of:
            per_group[group_of[made_by[r[0]]]].append(float(r[3]))
    curve, running = [], seed_scalar
    for values in per_group:
        running = max([running, *values])
        curve.append(running / seed_scalar)
    bounds = oriented_bounds(problem.components)
    vectors = np.array([oriented_array(problem.components, json.loads(r[2])) for r in valid])
    lo = np.array([b[0] if b else vectors[:, i].min() for i, b in enumerate(bounds)])
    hi = np.array([b[1] if b else vectors[:, i].max() for i, b in enumerate(bounds)])
    unit = (vectors - lo) / np.where(hi > lo, hi - lo, 1.0)
    pairs = list(combinations(range(len(unit)), 2))
    diversity = float(np.mean([np.linalg.norm(unit[a] - unit[b]) for a, b in pairs])) if pairs else 0.0
    return ArmResult(
        problem="",
        arm="",
        seed=0,
        seed_scalar=seed_scalar,
        best_scalar=best,
        best_ratio=best / seed_scalar,
        curve=curve,
        valid_per_group=[len(v) for v in per_group],
        new_valid=0,
        tokens=0,
        valid_per_1k_tokens=0.0,
        copy_share=0.0,
        diversity=diversity,
        groups=0,
        updates=0,
        update_failures=0,
        seconds={"evaluation": round(sum(float(r[5] or 0.0) for r in rows), 1)},
    )


def best_known(problem: Problem) -> float:
    """The probe rule's ceiling: the scalar of a program at every component's best declared bound (for these
    problems the best known value; a problem without bounds on every component cannot be chosen)."""
    bounds = scalar_bounds(problem.components)
    return float("nan") if bounds is None else bounds[1]
