"""Does an update make the policy better at the problem? best@k before and after, outside the search loop.

The offline twin of the VPO paper's measure, free of the search's own noise (which parent is picked, what the
archive holds). From the untrained arm's archive of a problem (`--db`): train a VPO and a GRPO policy on the same
groups (`evolve train` on a copy of the archive each, `--steps` updates); then, for a fixed set of parent prompts
(`--prompts`, the archive's own prompts, evenly spaced over the run, one per parent, then more of the same
parents where the run had fewer) of that problem and of a problem none of them trained on (`--held-out-db`,
another run's archive, if given), sample K completions from each policy, the untrained one included, with the
same seed per prompt for every policy. Every variant is parsed against its parent and the new ones are evaluated in the
process sandbox.

Reported per policy and problem: best@k over the parent for k = 1..K (the best child's scalar among the first k
completions minus the parent's, 0 when no child beats it, in units of the scalar's declared range where the
problem declares one), the share of new valid children among the variants, and the share of copies (unchanged
or duplicate variants). Last lines: `best_at_k none=... grpo=... vpo=... k=K` for the trained problem and
`best_at_k_held_out ...` for the other.

`--methods` names the trained policies (default grpo,vpo); `--methods=` measures the untrained one alone (the
smoke run's: a tiny model cannot train on an archive another model's tokens fill), `--max-new-tokens` caps it.
Usage: python -m benchmarks.best_at_k --db A.db [--held-out-db B.db] [--k 12] [--prompts 8] [--steps 2]
           [--learning-rate 1e-4] [--policy llama:embedded] [--out best_at_k.json] [--work DIR]
           [--adapter grpo=DIR --adapter vpo=DIR]  (measure adapters trained elsewhere, e.g. closed-loop arms')
An interrupted run resumes from `--work` (the trained copies and each policy's finished measurements are kept).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from evolve.archive import Archive
from evolve.archive.codehash import code_hash
from evolve.fitness import scalar_bounds, scalar_view
from evolve.problem import Problem, load_problem
from evolve.prompts import parse_completion
from policies.answer_grammar import AnswerShape
from policies.from_spec import make_policy
from policies.policy import SamplingParams
from sandboxes.backends import make_sandbox

KIND = "experiment"
SMOKE_ARGS = (  # a run of seconds (python -m benchmarks --smoke): the untrained tiny model on one study prompt
    "--db", "{study}/probe/tour_heuristic/arm.db", "--policy", "transformers:{tiny_model}", "--methods=",
    "--k", "1", "--prompts", "1", "--max-new-tokens", "16", "--work", "{scratch}",
)  # fmt: skip

POLICIES = ("none", "grpo", "vpo")


@dataclass(frozen=True)
class Parent:
    """One fixed prompt: the archive's own text, its parent's code and scalar, and how the run sampled it (its first
    completion's stored settings: the answer's shape held by a grammar, stop strings, token budget; {} if none)."""

    prompt: str
    code: str
    scalar: float
    sampling: dict = field(default_factory=dict)


def sampling_params(parent: Parent, options: dict, seed: int) -> SamplingParams:
    """The run's own decoding of this prompt, seeded: a policy trained on grammar-held answers, sampled as free
    text, wrote the answer's tags with nothing in them (`<variant 1>…</variant 1>`, its code outside), so best@k
    measured a decoding the loop never uses. The copy guard's `avoid` is left out: copies are counted here."""
    stored = parent.sampling
    shape = stored.get("structured")
    return SamplingParams(
        temperature=float(stored.get("temperature", options.get("temperature", 0.8))),
        top_p=float(stored.get("top_p", options.get("top_p", 0.95))),
        max_new_tokens=int(stored.get("max_new_tokens", options.get("max_new_tokens", 512))),
        seed=seed,
        top_k=int(stored.get("top_k", 0)),
        stop=tuple(stored.get("stop", ())),
        structured=AnswerShape(**{**shape, "files": tuple(shape.get("files", ()))}) if shape else None,
    )


@dataclass
class Measured:
    policy: str
    problem: str
    gains: list[list[float]] = field(default_factory=list)  # per prompt: best@k gain for k = 1..K
    variants: int = 0
    new_valid: int = 0
    copies: int = 0
    adapter: str = ""  # the adapter measured: "" for the untrained policy (and in files from before it was kept)

    def best_at(self, k: int) -> float:
        return float(np.mean([g[k - 1] for g in self.gains])) if self.gains else float("nan")


def pick_prompts(prompts: list[tuple[str, int]], count: int) -> list[tuple[str, int]]:
    """`count` of a run's (prompt text, parent id) in run order: the first prompt of each parent, evenly spaced;
    where the run had fewer parents than `count` (a small model's search keeps returning to a few), its later
    prompts of the same parents, evenly spaced, up to `count` (they differ in the programs and children shown)."""
    firsts: dict[int, tuple[str, int]] = {}
    for text, pid in prompts:
        firsts.setdefault(pid, (text, pid))
    heads = list(firsts.values())
    picked = [heads[int(i)] for i in np.linspace(0, len(heads) - 1, min(count, len(heads)))] if heads else []
    taken = set(picked)
    rest = [p for p in dict.fromkeys(prompts) if p not in taken]
    if len(picked) < count and rest:
        picked += [rest[int(i)] for i in np.linspace(0, len(rest) - 1, min(count - len(picked), len(rest)))]
    return picked


def parents(db: Path, count: int) -> tuple[Problem, list[Parent], dict]:
    """`count` prompts of the archive's (first) run, evenly spaced, one per parent, and the run's options."""
    con = sqlite3.connect(db)
    try:
        run_id, folder, config = con.execute("SELECT id, problem_dir, config FROM runs ORDER BY id LIMIT 1").fetchone()
        rows = con.execute(
            "SELECT pr.text, pr.parent_id, e.scalar, (SELECT c.sampling FROM completions c WHERE c.prompt_id = pr.id "
            "ORDER BY c.id LIMIT 1) FROM prompts pr JOIN evaluations e ON e.program_id = pr.parent_id "
            "WHERE pr.run_id = ? AND e.scalar IS NOT NULL ORDER BY pr.id",
            (run_id,),
        ).fetchall()
    finally:
        con.close()
    picked = pick_prompts([(text, pid) for text, pid, _, _ in rows], count)
    scalars = {pid: float(scalar) for _, pid, scalar, _ in rows}
    sampled = {(text, pid): json.loads(s) if s else {} for text, pid, _, s in reversed(rows)}  # the first one wins
    archive = Archive(db)  # the program's code through the archive: a program of several files is a tree there
    try:
        chosen = [
            Parent(text, archive.program(pid).code, scalars[pid], sampled[(text, pid)])  # type: ignore[union-attr]
            for text, pid in picked
        ]
    finally:
        archive.close()
    return load_problem(problem_folder(folder)), chosen, json.loads(config).get("options", {})


def problem_folder(stored: str) -> Path:
    """The run's problem folder: where the archive says, else this checkout's folder of that name (an archive made
    on another machine: the closed-loop study's, unpacked from results/closed_loop/arms.tar.xz)."""
    path = Path(stored)
    if path.is_dir():
        return path
    checkout = Path(__file__).resolve().parent.parent
    for folder in (checkout / "benchmarks" / "problems" / path.name, checkout / "problems" / path.name):
        if folder.is_dir():
            return folder
    return path  # load_problem says, in one line, that it is not a folder


def train(db: Path, method: str, steps: int, policy: str, learning_rate: float, work: Path) -> Path:
    """A copy of the archive trained `steps` times by `evolve train`; the newest adapter's folder. A copy trained
    before (an interrupted run of this benchmark resumed with the same `--work`) is not trained again."""
    copy, done = work / f"{method}.db", work / f"{method}.trained"
    if not done.exists():
        # An interrupted training left its copy's write-ahead log and adapters: SQLite would replay that log onto a
        # fresh copy (its versions with it) and the policy would get more updates than `steps`. Start clean.
        for stale in (copy, copy.with_name(copy.name + "-wal"), copy.with_name(copy.name + "-shm")):
            stale.unlink(missing_ok=True)
        shutil.rmtree(work / f"{method}.adapters", ignore_errors=True)
        shutil.copy(db, copy)
        command = [sys.executable, "-m", "evolve.cli", "train", str(copy), "--method", method, "--steps", str(steps)]
        command += ["--policy", policy, "--adapters-dir", str(work / f"{method}.adapters")]
        command += ["--learning-rate", str(learning_rate)]
        subprocess.run(command, check=True)
        done.touch()
    con = sqlite3.connect(copy)
    try:
        (adapter,) = con.execute(
            "SELECT adapter_path FROM policy_versions WHERE adapter_path IS NOT NULL ORDER BY number DESC LIMIT 1"
        ).fetchone()
    finally:
        con.close()
    return Path(adapter)


def kept_measurements(kept: Path, adapters: dict[str, Path]) -> dict[tuple[str, str], Measured]:
    """A resumed run's finished measurements, less those of another adapter than this run measures (a `--work`
    reused with other `--adapter`s would otherwise report the old policy's figures under the new one's name)."""
    rows = [Measured(**r) for r in json.loads(kept.read_text())] if kept.exists() else []
    return {(r.policy, r.problem): r for r in rows if r.adapter in ("", str(adapters.get(r.policy, "")))}


def adapter_arg(text: str) -> tuple[str, Path]:
    """`grpo=DIR` or `vpo=DIR`: an adapter folder trained elsewhere, measured in that method's place."""
    method, _, folder = text.partition("=")
    if method not in ("grpo", "vpo") or not (Path(folder) / "adapter_model.safetensors").is_file():
        raise SystemExit(f"--adapter {text}: give grpo=DIR or vpo=DIR, DIR a version holding adapter_model.safetensors")
    return method, Path(folder)


def measure(name: str, policy, problem: Problem, prompts: list[Parent], options: dict, k: int, sandbox) -> Measured:
    """K completions per prompt (seeded by the prompt's index), their new children evaluated."""
    out = Measured(name, problem.name)
    bounds = scalar_bounds(problem.components)
    scale = (bounds[1] - bounds[0]) if bounds and bounds[1] > bounds[0] else 1.0
    m = int(options.get("variants", 3))
    for index, parent in enumerate(prompts):
        params = sampling_params(parent, options, 1000 + index)
        seen = {code_hash(parent.code, problem.multi_file)}
        best, gains = parent.scalar, []
        for generated in policy.generate(parent.prompt, params, k):
            for variant in parse_completion(parent.code, generated.text, m, multi_file=problem.multi_file):
                out.variants += 1
                if variant.code is None:
                    out.copies += variant.status == "unchanged"
                    continue
                digest = code_hash(variant.code, problem.multi_file)
                if digest in seen:
                    out.copies += 1
                    continue
                seen.add(digest)
                outcome = sandbox.evaluate(problem, variant.code)
                if outcome.ok:
                    out.new_valid += 1
                    best = max(best, scalar_view(problem.components, outcome.scores))
            gains.append((best - parent.scalar) / scale)
        out.gains.append(gains)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", type=Path, required=True, help="the untrained arm's archive: trained on and measured")
    ap.add_argument("--held-out-db", type=Path, default=None, help="another problem's archive: measured only, if given")
    ap.add_argument("--k", type=int, default=12)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2, help="updates of each trained policy")
    ap.add_argument("--policy", default="llama:embedded")
    ap.add_argument("--learning-rate", type=float, default=1e-4, help="as the closed-loop study's arms")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--work", type=Path, default=None, help="kept between runs: an interrupted run resumes there")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="a smoke run's cap (default: as the run sampled)")
    ap.add_argument(
        "--methods",
        default="grpo,vpo",
        help="the trained policies measured beside the untrained one ('': the untrained one alone, a smoke run's)",
    )
    ap.add_argument(
        "--adapter",
        action="append",
        default=[],
        metavar="METHOD=DIR",
        help="measure this adapter (e.g. a closed-loop arm's last version) as METHOD's policy instead of training one",
    )
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="best-at-k-"))
    work.mkdir(parents=True, exist_ok=True)
    kept = work / "measured.json"
    given = dict(adapter_arg(a) for a in args.adapter)
    methods = [m for m in args.methods.split(",") if m]
    adapters = {
        method: given.get(method) or train(args.db, method, args.steps, args.policy, args.learning_rate, work)
        for method in methods
    }
    measured = [name for name in POLICIES if name == "none" or name in methods]
    done = kept_measurements(kept, adapters)
    sets = {"trained": parents(args.db, args.prompts)}
    if args.held_out_db:  # left out, each policy answers the trained problem's prompts alone (half the samples)
        sets["held_out"] = parents(args.held_out_db, args.prompts)
    if args.max_new_tokens is not None:  # a smoke run's: the untaught tiny model writes to the budget
        for _, prompts, _ in sets.values():
            for parent in prompts:
                parent.sampling["max_new_tokens"] = args.max_new_tokens
    sandbox = make_sandbox("process", workers=2)
    results: list[Measured] = []
    for name in measured:
        if all((name, problem.name) in done for problem, _, _ in sets.values()):
            results += [done[(name, problem.name)] for problem, _, _ in sets.values()]
            continue
        policy = make_policy(args.policy)
        if name in adapters:
            policy.publish(adapters[name], 1)  # type: ignore[attr-defined]
        for problem, prompts, options in sets.values():
            r = done.get((name, problem.name)) or measure(name, policy, problem, prompts, options, args.k, sandbox)
            r.adapter = str(adapters.get(name, ""))
            results.append(r)
            done[(r.policy, r.problem)] = r
            kept.write_text(json.dumps([asdict(x) for x in done.values()], indent=1))
            print(
                f"{name} on {problem.name}: best@1 {r.best_at(1):.4f} best@{args.k} {r.best_at(args.k):.4f}, "
                f"new valid {r.new_valid}/{r.variants}, copies {r.copies}/{r.variants}",
                flush=True,
            )
        policy.close()
    sandbox.close()
    if args.out:
        args.out.write_text(json.dumps([asdict(r) for r in results], indent=1))
    labels = {"trained": "best_at_k", "held_out": "best_at_k_held_out"}
    for role, (problem, _, _) in sets.items():
        label, problem_name = labels[role], problem.name
        rows = {r.policy: r for r in results if r.problem == problem_name}
        cells = " ".join(f"{p}={rows[p].best_at(args.k):.4f}" for p in measured)
        print(f"{label} {cells} k={args.k} problem={problem_name}")


if __name__ == "__main__":
    main()
