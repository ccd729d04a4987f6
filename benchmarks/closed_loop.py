"""Does training the policy on its own archive help the search? The closed-loop experiment of issue 27.

Fixed before looking at any result (written here first, then run):
- **Arms.** `none` (the untrained policy), `grpo` and `vpo`: the same search (`evolve run`'s machinery, see
  closed_loop_arm.py) on the same problem and seed, the same sampling settings (each problem's own `[search]`,
  the ask fixed, no stall stop), the same wall time per arm (`--minutes`); the trained arms update the policy
  every `--update-every` groups (LoRA rank 8, learning rate 1e-4, one optimizer step per group of 4: small
  steps), and every update (the trainer step, saving the adapter, exporting it to GGUF and loading it into the
  sampler) runs inside the arm's clock. Model loading is outside it and reported. Policy: the embedded
  Qwen2.5-Coder-0.5B-Instruct on llama.cpp (`llama:embedded`), trained through its bf16 copy.
- **Reward shaping** (policies/shaping.py), the same for both trained arms: zero-advantage groups skipped,
  copies (echoes of the parent, duplicates) rewarded -0.5, each component stretched over its group
  (`--lazy-penalty`, `--reward-normalisation`, `--keep-zero-advantage` change it for a run of the study).
- **Problems, by rule.** Candidates, in this order: minimizer, tour_heuristic, durations, spread_points,
  bin_packing (benchmarks/problems and problems/, none written or tuned for this experiment). A candidate is kept
  when the untrained policy (`none`), run for the same `--minutes` on the probe seed 100 (outside the
  benchmark's seeds 0, 1, 2, ...), makes at least 2 new valid children and ends below the problem's best known
  value (the scalar at every component's best declared bound). The study takes the first 3 kept. `--probe`
  runs this rule and prints the `--problems` value to use; the choice looks at the `none` arm only.
- **Held out.** Each arm's final policy answers `held_out_groups` groups from the seed of a problem that no arm
  trains on, `roman_numerals` (string processing: unlike the candidates), with the same sampling draws for every
  arm; reported as best of its k answers over that seed's scalar.
- **Reported.** Per arm, mean ± sd over problems x seeds: best/seed at the budget and its curve over time (at
  each tenth of the budget), new valid children per 1,000 tokens, archive diversity (mean pairwise distance of
  the valid programs' score vectors scaled by their bounds), held-out best@k over seed; wall time per part. Last
  the line `closed_loop none=... grpo=... vpo=... (best/seed, mean±sd over problems x seeds)` and the paired
  differences VPO-none and VPO-GRPO over (problem, seed) pairs with a 95% bootstrap interval.

Usage: python -m benchmarks.closed_loop --probe [--minutes 20]
       python -m benchmarks.closed_loop --problems minimizer,tour_heuristic,durations [--seeds 3] [--minutes 20]
           [--update-every 1] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import asdict, fields
from pathlib import Path

import numpy as np
import torch

from benchmarks.closed_loop_arm import ArmResult, ArmSettings, best_known, run_arm
from evolve.problem import load_problem

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ("minimizer", "tour_heuristic", "durations", "spread_points", "bin_packing")
HELD_OUT = "roman_numerals"
PROBE_SEED = 100
ARMS = ("none", "grpo", "vpo")
STUDY_PROBLEMS = 3
MIN_NEW_VALID = 2
COLUMNS = ("best_ratio", "valid_per_1k_tokens", "copy_share", "diversity", "held_out_ratio", "groups", "updates")


def folder(name: str) -> Path:
    for base in (ROOT / "benchmarks" / "problems", ROOT / "problems"):
        if (base / name / "problem.toml").is_file():
            return base / name
    raise SystemExit(f"no problem {name!r} in benchmarks/problems or problems/")


def probe(settings: ArmSettings, candidates: list[str], out: Path | None) -> None:
    """The rule: the untrained arm on the probe seed; keep a candidate that makes new children and stalls."""
    kept, rows = [], []
    for name in candidates:
        with tempfile.TemporaryDirectory() as tmp:
            r = run_arm(folder(name), "none", PROBE_SEED, settings, Path(tmp), None)
        ceiling = best_known(load_problem(folder(name)))
        keep = r.new_valid >= MIN_NEW_VALID and r.best_scalar < ceiling
        rows.append(asdict(r) | {"best_known": ceiling, "kept": keep})
        print(
            f"probe {name}: {r.new_valid} new valid children, best {r.best_scalar:.4g} (seed {r.seed_scalar:.4g}, "
            f"best known {ceiling:.4g}) -> {'kept' if keep else 'left out'}; seconds {r.seconds}",
            flush=True,
        )
        if keep:
            kept.append(name)
        if len(kept) == STUDY_PROBLEMS:
            break
    if out:
        out.write_text(json.dumps(rows, indent=1))
    print(f"probe chose --problems {','.join(kept)}")


def ms(values: list[float]) -> str:
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    return "n/a" if not len(v) else f"{v.mean():.3f}±{v.std(ddof=1) if len(v) > 1 else 0.0:.3f}"


def bootstrap(diffs: list[float], draws: int = 10_000) -> tuple[float, float, float]:
    """Mean of paired differences and its 95% percentile bootstrap interval (resampling pairs)."""
    d = np.asarray(diffs, dtype=float)
    means = np.random.default_rng(0).choice(d, size=(draws, len(d)), replace=True).mean(axis=1)
    return float(d.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def report(results: list[ArmResult], settings: ArmSettings) -> None:
    by_arm = {a: [r for r in results if r.arm == a] for a in ARMS}
    print(f"\nsettings {asdict(settings)}")
    print("arm   | best/seed | new valid /1k tok | copies | diversity | held-out best@k/seed | groups | updates")
    for arm, rows in by_arm.items():
        k = rows[0].held_out_k if rows else 0
        cells = [ms([getattr(r, c) for r in rows]) for c in COLUMNS]
        cells[4] += f" (k={k})"
        print(f"{arm:5} | " + " | ".join(cells))
    print("best/seed over time (mean over problems x seeds, at each tenth of the budget):")
    for arm, rows in by_arm.items():
        if rows:
            curve = np.mean([r.curve for r in rows], axis=0)
            print(f"  {arm:5} " + " ".join(f"{v:.3f}" for v in curve))
    print("wall seconds per part (mean over runs):")
    for arm, rows in by_arm.items():
        keys = sorted({k for r in rows for k in r.seconds})
        print(f"  {arm:5} " + ", ".join(f"{k} {np.mean([r.seconds.get(k, 0.0) for r in rows]):.0f}" for k in keys))
    pairs = {(r.problem, r.seed): {} for r in results}
    for r in results:
        pairs[(r.problem, r.seed)][r.arm] = r.best_ratio
    line = "closed_loop " + " ".join(f"{a}={ms([r.best_ratio for r in by_arm[a]])}" for a in ARMS)
    line += " (best/seed, mean±sd over problems x seeds)"
    for other in ("none", "grpo"):
        diffs = [p["vpo"] - p[other] for p in pairs.values() if "vpo" in p and other in p]
        if diffs:
            mean, lo, hi = bootstrap(diffs)
            line += f" vpo-{other}={mean:+.3f} [{lo:+.3f}, {hi:+.3f}] (n={len(diffs)})"
    print(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", action="store_true", help="run the problem rule on the probe seed and stop")
    ap.add_argument("--problems", default=None, help="comma-separated, as the probe chose them")
    ap.add_argument("--candidates", default=",".join(CANDIDATES), help="what the probe tries, in order (a pilot: one)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--minutes", type=float, default=ArmSettings.minutes, help="wall time per arm")
    ap.add_argument("--update-every", type=int, default=ArmSettings.update_every, help="groups between updates")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--policy", default=ArmSettings.policy)
    ap.add_argument("--learning-rate", type=float, default=ArmSettings.learning_rate)
    ap.add_argument("--lazy-penalty", type=float, default=ArmSettings.lazy_penalty)
    ap.add_argument("--reward-normalisation", default=ArmSettings.reward_normalisation)
    ap.add_argument("--keep-zero-advantage", action="store_true")
    ap.add_argument("--held-out-groups", type=int, default=ArmSettings.held_out_groups)
    ap.add_argument("--out", type=Path, default=None, help="write every arm's figures as JSON")
    args = ap.parse_args()
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # the trainer's threads: the cores this process may use
    settings = ArmSettings(
        policy=args.policy,
        minutes=args.minutes,
        update_every=args.update_every,
        learning_rate=args.learning_rate,
        skip_zero_advantage=not args.keep_zero_advantage,
        lazy_penalty=args.lazy_penalty,
        reward_normalisation=args.reward_normalisation,
        held_out_groups=args.held_out_groups,
    )
    if args.probe:
        probe(settings, args.candidates.split(","), args.out)
        return
    if not args.problems:
        raise SystemExit("--problems: give the problems the probe chose (python -m benchmarks.closed_loop --probe)")
    started, results = time.time(), []
    for name in args.problems.split(","):
        for seed in range(args.seeds):
            for arm in args.arms.split(","):
                with tempfile.TemporaryDirectory() as tmp:
                    r = run_arm(folder(name), arm, seed, settings, Path(tmp), folder(HELD_OUT))
                results.append(r)
                shown = {f.name: getattr(r, f.name) for f in fields(r) if f.name not in ("curve",)}
                print(f"{name} seed {seed} {arm}: {shown} ({time.time() - started:.0f}s)", flush=True)
                if args.out:
                    args.out.write_text(json.dumps([asdict(x) for x in results], indent=1))
    report(results, settings)
    print(f"elapsed {time.time() - started:.0f}s")


if __name__ == "__main__":
    main()
