"""Does training on an archive make the policy better at improving parents it never trained on, beyond the noise of
training itself?

Protocol (issue 61). From an untrained arm's archive (`--db`): its parents in run order, every third one held out
(up to `--held-out`), the others' groups the training set (up to `--train-parents` parents; the held-out parents'
groups are deleted from each training copy, so no update sees them). Each method of `--methods` (none, grpo, vpo)
is trained `--trainings` times independently (training t seeds the trainer's shuffling and weights with t) for
`--steps` updates on a copy of the archive, with the run's policy (`--policy`) and the given shaping
(`--reward-normalisation`, improvement by default), PPO `--epochs` and `--kl`; "none" is not trained. Each update
learns from every training group, or with `--groups-per-step G` from G of the groups whose completions the shaping
tells apart, taken in an order drawn per training (the same for every method of training t): the scale at which
this CPU machine can finish 30 updates a training (a GPU box leaves it out). Then every
policy samples K completions (`--k`) per held-out parent with the parent's stored decoding; training t's samples use
the seeds 1000 * t + prompt index for every method, so methods differ in their weights alone. Each new variant is
evaluated in the process sandbox. Per training: P(an answer beats its parent) (valid new child whose scalar view is
above the parent's) and best@k for k = 1..K (the best child's scalar gain over the parent in the scalar's range
units, 0 where none beats it), averaged over held-out parents. Methods are compared over trainings, not prompts: an
exact permutation test of the difference of the means of best@K over the trainings' labels (two-sided; with 3
trainings a method the smallest p is 0.1). The last line: `improve_at_k none=... grpo=... vpo=... k=K trainings=N
p_vpo_none=... p_vpo_grpo=...`.

Resumable: everything lives under `--work`: each training's copy and adapters, and the measurements in
`state.json.xz` (xz-compressed JSON, written after each held-out parent a policy is measured on: one policy's
measurement is most of an hour on a CPU core, and one cut off goes on at its next parent with the same draws); a
training whose copy holds `--steps` versions is not trained again, and one cut off goes on from its newest version
and its optimiser's moments. The split a folder began with is kept in `split.json`; a later run whose archive or options
give other parents is refused (an archive still growing: finish it first, or give a new `--work`). With `--keep
DIR` (a folder to commit), the small files are copied there after each held-out parent and each finished
training's adapter is packed there (`benchmarks/kept_work.py`), so that a later sitting on a new machine measures
it without training again.

    python -m benchmarks.improve_at_k --db A.db --work W [--steps 30] [--trainings 3] [--k 12] [--epochs 4]
        [--groups-per-step 1]
    python -m benchmarks.improve_at_k --smoke   # the tiny model on a tiny archive, in a temporary directory
"""

from __future__ import annotations

import argparse
import json
import lzma
import shutil
import sqlite3
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.best_at_k import Parent, sampling_params
from benchmarks.kept_work import KeptMismatch, KeptWork
from evolve.archive import Archive
from evolve.archive.codehash import code_hash
from evolve.devtools.exact_test import permutation_p
from evolve.fitness import scalar_bounds, scalar_view
from evolve.group_slices import StepProgress, step_slice
from evolve.problem import Problem, load_problem
from evolve.prompts import parse_completion
from evolve.training import ArchiveTrainer
from policies.from_spec import make_policy
from policies.trainer import TrainConfig

KIND = "experiment"
SMOKE_ARGS = ("--smoke",)  # a run of seconds (python -m benchmarks --smoke)
METHODS = ("none", "grpo", "vpo")


@dataclass
class Measurement:
    """One policy (a method's training t) on the held-out parents."""

    method: str
    training: int
    gains: list[list[float]] = field(default_factory=list)  # per parent: best@k gain for k = 1..K
    answers: int = 0
    beats: int = 0

    def best_at(self, k: int) -> float:
        return float(np.mean([g[k - 1] for g in self.gains])) if self.gains else float("nan")

    def p_beat(self) -> float:
        return self.beats / self.answers if self.answers else float("nan")


def split_parents(db: Path, train_parents: int, held_out: int) -> tuple[list[int], list[int]]:
    """(training parent ids, held-out parent ids): the run's parents in order of first prompt, every third held out."""
    con = sqlite3.connect(db)
    try:
        ids = [pid for (pid,) in con.execute("SELECT parent_id FROM prompts ORDER BY id")]
    finally:
        con.close()
    ordered = list(dict.fromkeys(ids))
    held = [p for i, p in enumerate(ordered) if i % 3 == 2][:held_out]
    train = [p for p in ordered if p not in held][:train_parents]
    return train, held


def held_out_prompts(db: Path, held: list[int]) -> tuple[Problem, list[Parent], dict]:
    """The first prompt of each held-out parent, with its parent's code and scalar and its stored decoding."""
    con = sqlite3.connect(db)
    try:
        folder, config = con.execute("SELECT problem_dir, config FROM runs ORDER BY id LIMIT 1").fetchone()
        rows = con.execute(
            "SELECT pr.text, pr.parent_id, e.scalar, (SELECT c.sampling FROM completions c WHERE c.prompt_id = pr.id "
            "ORDER BY c.id LIMIT 1) FROM prompts pr JOIN evaluations e ON e.program_id = pr.parent_id "
            "WHERE e.scalar IS NOT NULL ORDER BY pr.id"
        ).fetchall()
    finally:
        con.close()
    first = {}
    for text, pid, scalar, sampling in rows:
        first.setdefault(pid, (text, float(scalar), json.loads(sampling) if sampling else {}))
    archive = Archive(db, create=False)
    try:
        chosen = [Parent(first[p][0], archive.program(p).code, first[p][1], first[p][2]) for p in held if p in first]  # type: ignore[union-attr]
    finally:
        archive.close()
    return load_problem(Path(folder)), chosen, json.loads(config).get("options", {})


class SplitChanged(Exception):
    """The work folder was begun on other parents: its training copy and measurements belong to that split."""


def keep_split(path: Path, train: list[int], held: list[int], k: int, policy: str, rank: int) -> None:
    """Record the split a work folder begins with, and its K, policy and LoRA rank; refuse others later (an archive
    that grew since, other --train-parents, --held-out, --k, --policy or --lora-rank): the training copy is made once,
    the measurements are per held-out parent, K completions each, of that policy, and kept adapters have that rank."""
    split = {"train": train, "held_out": held, "k": k, "policy": policy, "lora_rank": rank}
    if not path.exists():
        path.write_text(json.dumps(split))
        return
    kept = json.loads(path.read_text())
    kept.setdefault("lora_rank", TrainConfig.lora_rank)  # begun before the rank was an option: the trainer's
    if kept != split:
        raise SplitChanged(
            f"{path.parent} was begun on {len(kept['train'])} training and {len(kept['held_out'])} held-out parents, "
            f"K={kept.get('k')}, policy {kept.get('policy')}, LoRA rank {kept.get('lora_rank')} ({path}); this archive "
            f"and these options give {len(train)} and {len(held)}, K={k}, policy {policy}, LoRA rank {rank}: give a "
            "new --work, or what it was begun with"
        )


def training_copy(db: Path, work: Path, keep: list[int]) -> Path:
    """A copy of the archive holding the training parents' groups alone (made once)."""
    copy = work / "train.db"
    if copy.exists():
        return copy
    staging = work / "train.db.partial"
    shutil.copy(db, staging)
    con = sqlite3.connect(staging)
    try:
        marks = ",".join("?" * len(keep))
        gone = f"SELECT id FROM prompts WHERE parent_id NOT IN ({marks})"
        con.execute(
            f"DELETE FROM variants WHERE completion_id IN (SELECT id FROM completions WHERE prompt_id IN ({gone}))",
            keep,
        )
        con.execute(f"DELETE FROM completions WHERE prompt_id IN ({gone})", keep)
        con.commit()
    finally:
        con.close()
    staging.rename(copy)
    return copy


def train(source: Path, work: Path, method: str, t: int, steps: int, args: argparse.Namespace) -> Path | None:
    """Training t of `method`: `steps` updates on its own copy of the training archive; its newest adapter (None
    where no step had anything to learn from)."""
    folder = work / f"{method}-t{t}"
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / "train.db"
    if not copy.exists():
        shutil.copy(source, copy)
    archive = Archive(copy)
    try:
        run = archive.find_run(None)
        done = [v for v in archive.policy_versions(run.id) if v.adapter_path]
        policy = make_policy(args.policy)
        config = TrainConfig(
            method=method,
            learning_rate=args.learning_rate,
            epochs=args.epochs,
            kl_coef=args.kl,
            reward_normalisation=args.reward_normalisation,
            lora_rank=args.lora_rank,
            versions_back=10**6,
            seed=t,
        )
        import torch

        torch.manual_seed(t)  # the adapter's initial weights
        components = list(load_problem(Path(run.problem_dir)).components)
        variants = int(run.config["options"]["variants"])
        trainer = ArchiveTrainer(archive, run.id, components, variants, policy, config, folder / "adapters", 10**6)
        progress, versions = StepProgress(folder / "steps.json"), len(done)
        for step in range(progress.next_step(versions), steps):
            per_step = args.groups_per_step
            stats = trainer.step(pick=None if per_step is None else step_slice(step, per_step, t, config))
            versions += stats.samples > 0  # a step saves a version exactly when it had samples (else it raises)
            progress.record(step, versions)
            print(
                f"{method} t{t} step {step + 1}/{steps}: {stats.samples} completions, clip by epoch "
                f"{[round(c, 3) for c in stats.epoch_clip_fractions]}",
                flush=True,
            )
        saved = [v for v in archive.policy_versions(run.id) if v.adapter_path]
        policy.close()
        if not saved:  # no step had a completion to learn from: the policy is the base's
            return None
        return Path(max(saved, key=lambda v: v.number).adapter_path)  # type: ignore[arg-type]
    finally:
        archive.close()


def measure(
    out: Measurement, policy, problem: Problem, parents: list[Parent], options: dict, k: int, sandbox, checkpoint
) -> Measurement:
    """`out` extended to every held-out parent, from the first it has no gains for; `checkpoint(out)` after each
    parent, so that a measurement of hours cut off resumes at its parent (each parent's draws are seeded by the
    training and the parent's place: the same whether or not the run was cut)."""
    t = out.training
    bounds = scalar_bounds(problem.components)
    scale = (bounds[1] - bounds[0]) if bounds and bounds[1] > bounds[0] else 1.0
    m = int(options.get("variants", 3))
    for index, parent in enumerate(parents):
        if index < len(out.gains):
            continue
        params = sampling_params(parent, options, 1000 * t + index)
        seen = {code_hash(parent.code, problem.multi_file)}
        best, gains = parent.scalar, []
        for generated in policy.generate(parent.prompt, params, k):
            for variant in parse_completion(parent.code, generated.text, m, multi_file=problem.multi_file):
                out.answers += 1
                digest = None if variant.code is None else code_hash(variant.code, problem.multi_file)
                if digest is None or digest in seen:
                    continue
                seen.add(digest)
                outcome = sandbox.evaluate(problem, variant.code)
                if outcome.ok:
                    value = scalar_view(problem.components, outcome.scores)
                    out.beats += value > parent.scalar
                    best = max(best, value)
            gains.append((best - parent.scalar) / scale)
        out.gains.append(gains)
        checkpoint(out)
    return out


def load_state(path: Path) -> dict[str, Measurement]:
    if not path.exists():
        return {}
    rows = json.loads(lzma.decompress(path.read_bytes()))
    return {f"{r['method']}-t{r['training']}": Measurement(**r) for r in rows}


def save_state(path: Path, state: dict[str, Measurement]) -> None:
    staging = path.with_name(path.name + ".partial")
    staging.write_bytes(lzma.compress(json.dumps([asdict(m) for m in state.values()]).encode()))
    staging.rename(path)


def checkpoint(path: Path, state: dict[str, Measurement], kept: KeptWork | None) -> None:
    save_state(path, state)
    if kept is not None:
        kept.save()


def report(state: dict[str, Measurement], methods: list[str], k: int, parents: int) -> None:
    """The table and the line, over the measurements of `methods` that reached every held-out parent."""
    state = {key: m for key, m in state.items() if len(m.gains) == parents and m.method in methods}
    print(f"| method | training | P(answer beats parent) | best@1 | best@{k} |")
    print("|---|---|---|---|---|")
    for m in sorted(state.values(), key=lambda m: (methods.index(m.method), m.training)):
        print(f"| {m.method} | {m.training} | {m.p_beat():.4f} | {m.best_at(1):.4f} | {m.best_at(k):.4f} |")
    per = {name: [m.best_at(k) for m in state.values() if m.method == name] for name in methods}
    cells = " ".join(f"{name}={np.mean(v):.4f}" for name, v in per.items() if v)
    tests = " ".join(
        f"p_vpo_{other}={permutation_p(per['vpo'], per[other]):.3f}"
        for other in ("none", "grpo")
        if per.get("vpo") and per.get(other)
    )
    finished = min(len(v) for v in per.values())  # trainings of every method measured to the end
    print(f"improve_at_k {cells} k={k} trainings={finished} {tests}".rstrip())


def run(args: argparse.Namespace) -> None:
    work: Path = args.work
    work.mkdir(parents=True, exist_ok=True)
    train_ids, held = split_parents(args.db, args.train_parents, args.held_out)
    print(f"{len(train_ids)} training parents, {len(held)} held out", flush=True)
    kept = None if args.keep is None else KeptWork(args.keep, work)
    if kept is not None:
        kept.restore()  # a new machine: the measurements and split of past sittings
    for folder in (work, *([] if kept is None else [kept.folder])):  # the kept split too, before any adapter is
        keep_split(folder / "split.json", train_ids, held, args.k, args.policy, args.lora_rank)
    source = training_copy(args.db, work, train_ids)
    problem, parents, options = held_out_prompts(args.db, held)
    state_path = work / "state.json.xz"
    state = load_state(state_path)
    from sandboxes.backends import make_sandbox

    sandbox = make_sandbox("process", workers=2)
    try:
        for t in range(args.trainings):
            for method in args.methods:
                key = f"{method}-t{t}"
                if key in state and len(state[key].gains) == len(parents):
                    continue
                if method == "none":
                    adapter = None
                elif kept is not None and kept.has_adapter(key):
                    adapter = kept.adapter(key, args.lora_rank)  # trained in a past sitting: measured, not again
                else:
                    adapter = train(source, work, method, t, args.steps, args)
                    if kept is not None:
                        kept.keep_adapter(key, adapter)
                policy = make_policy(args.policy)
                if adapter is not None:
                    policy.publish(adapter, 1)  # type: ignore[attr-defined]
                state.setdefault(key, Measurement(method, t))
                measure(
                    state[key],
                    policy,
                    problem,
                    parents,
                    options,
                    args.k,
                    sandbox,
                    lambda _: checkpoint(state_path, state, kept),
                )
                policy.close()
                print(
                    f"{key}: P(beat) {state[key].p_beat():.4f} best@{args.k} {state[key].best_at(args.k):.4f}",
                    flush=True,
                )
    finally:
        sandbox.close()
    report(state, list(args.methods), args.k, len(parents))


def smoke(args: argparse.Namespace) -> None:
    """The whole protocol at toy size: the tiny model (saved in a temporary directory) on reward_replay's tiny
    archive of minimizer, 1 training parent and 1 held out, 2 trainings of 1 step, K = 2."""
    from benchmarks.reward_replay import smoke_archive
    from policies.tiny import tiny_model, tiny_tokenizer

    with tempfile.TemporaryDirectory(prefix="improve-at-k-smoke-") as tmp:
        root = Path(tmp)
        tok = tiny_tokenizer()
        tiny_model(tok, seed=0).save_pretrained(root / "tiny")
        tok.save_pretrained(root / "tiny")
        db = smoke_archive(root / "smoke.db", parents=3)
        args.db, args.work, args.policy = db, root / "work", f"transformers:{root / 'tiny'}"
        args.train_parents, args.held_out, args.trainings, args.steps, args.k, args.epochs = 2, 1, 2, 2, 2, 2
        args.groups_per_step = 1
        run(args)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", type=Path, help="an untrained arm's archive")
    ap.add_argument("--work", type=Path, help="kept between runs: an interrupted run resumes there")
    ap.add_argument("--train-parents", type=int, default=32)
    ap.add_argument("--held-out", type=int, default=16)
    ap.add_argument("--trainings", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--k", type=int, default=12)
    ap.add_argument("--methods", type=lambda s: s.split(","), default=list(METHODS))
    ap.add_argument("--groups-per-step", type=int, default=None, help="each update on this many groups (default: all)")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--kl", type=float, default=0.0)
    ap.add_argument("--learning-rate", type=float, default=1e-4)
    # An adapter of the 0.5B model on every projection holds 0.55 M parameters per unit of rank (2.2 MB in float32):
    # six kept across sittings at rank 16 would put 210 MB in the repository, and RL learns few bits an episode.
    ap.add_argument("--lora-rank", type=int, default=TrainConfig.lora_rank)
    ap.add_argument("--reward-normalisation", default="improvement")
    ap.add_argument("--policy", default="llama:embedded")
    ap.add_argument(
        "--keep", type=Path, help="a folder to commit: measurements and finished adapters, kept across machines"
    )
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        smoke(args)
        return
    if args.db is None or args.work is None:
        raise SystemExit("give --db (an untrained arm's archive) and --work (a folder kept between runs), or --smoke")
    try:
        run(args)
    except (SplitChanged, KeptMismatch) as exc:
        raise SystemExit(f"improve_at_k: {exc}") from None


if __name__ == "__main__":
    main()
