"""Which groups of the closed-loop study's trained arms give no advantage, under VPO's reward and under GRPO's.

A group trains nothing when every completion's reward is the same. The study's VPO arms made fewer updates than
its GRPO arms (11.8 against 13.8 in 16 groups); this replays every stored group of every trained arm through both
rewards, with the study's shaping (group normalisation, lazy penalty -0.5), and says how many are flat under each
and how many of those are flat only because every answer in them was wasted (no new valid program), which no
reward can learn from.

Reads the study's archives from arms.tar.xz, unpacked once (study_archives.py); `--arms` picks arms by a glob
on their folder names. Prints a row per arm, a row per method, then the result line
`flat_groups vpo_flat=... grpo_flat=... groups=...` (over every arm read).

    python -m benchmarks.flat_groups [--arms 'tour_heuristic-*']
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
from sqlalchemy import text

from evolve.archive import Archive
from evolve.problem import load_problem
from evolve.training import load_batch
from policies.advantages import GRPO, VPO
from policies.shaping import shape_rewards

KIND = "analysis"
SMOKE_ARGS = ("--arms", "minimizer-s0-vpo")
PROBLEMS = Path(__file__).parent / "problems"
COLUMNS = ("groups", "all wasted", "vpo flat", "grpo flat", "vpo flat, some valid", "grpo flat, some valid")


def arm_counts(arm_dir: Path, problem: str) -> Counter[str]:
    components = list(load_problem(PROBLEMS / problem).components)
    archive = Archive(arm_dir / "arm.db", create=False)
    try:
        run = archive.find_run(None)
        with archive.db.session() as s:
            query = text("SELECT id FROM policy_versions WHERE run_id = :run")
            versions = [row[0] for row in s.execute(query, {"run": run.id})]
        batch = load_batch(archive, run.id, components, 3, versions)
    finally:
        archive.close()
    counts: Counter[str] = Counter()
    for group in batch.groups:
        shaped = shape_rewards(group.rewards(), group.wasted(), normalisation="group", lazy_penalty=-0.5)
        wasted = bool(group.wasted().all())
        for name, estimator in (("vpo", VPO()), ("grpo", GRPO())):
            flat = bool(np.all(estimator(shaped, seed=0) == 0))
            counts[f"{name} flat"] += flat
            counts[f"{name} flat, some valid"] += flat and not wasted
        counts["groups"] += 1
        counts["all wasted"] += wasted
    return counts


def main() -> None:
    from benchmarks.study_archives import study_folder

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arms", default="*", help="a glob on the arms' folder names")
    args = ap.parse_args()
    print("| arm | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    by_method: dict[str, Counter[str]] = {"grpo": Counter(), "vpo": Counter()}
    for arm_dir in sorted((study_folder() / "arms").glob(args.arms)):
        problem, _seed, arm = arm_dir.name.rsplit("-", 2)
        if arm not in by_method or not (arm_dir / "arm.db").is_file():
            continue
        counts = arm_counts(arm_dir, problem)
        by_method[arm].update(counts)
        print(f"| {arm_dir.name} | " + " | ".join(str(counts[c]) for c in COLUMNS) + " |")
    for arm, counts in by_method.items():
        print(f"| all {arm} arms | " + " | ".join(str(counts[c]) for c in COLUMNS) + " |")
    flat = " ".join(f"{arm}_flat={counts[f'{arm} flat']}" for arm, counts in by_method.items())
    print(f"flat_groups {flat} groups={sum(c['groups'] for c in by_method.values())}")


if __name__ == "__main__":
    main()
