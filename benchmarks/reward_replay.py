"""Replay stored archives through a reward, without training: does the advantage follow "this answer beat its
parent", and does VPO's advantage differ from one fixed scalarisation's?

Protocol. Every archive found under `--source` (a directory, or a `.tar.xz` of archives unpacked into a temporary
directory; by default the closed-loop study's 18 arms, `arms/*/arm.db`) is read as training reads it
(`evolve.training.load_batch` over every policy version of its run: every group, each with its parent's vector,
normalised by the problem's declared bounds). Each group then goes through each reward shaping
(policies/shaping.py): `study` (group normalisation, lazy penalty -0.5: the closed-loop study's) and
`improvement` (the gain over the parent). Per group and reward:

- VPO's advantage (100 Dirichlet(1) weights, seeded by the group's index, as an update draws them) and the
  fixed equal-weight max's (Multi-RLVR: each completion's best answer under the weights 1/D, z-normalised alike);
- a completion *beat its parent* when one of its answers is a valid child that does not score exactly as the parent
  and whose mean gain over the components, in units of their ranges, is above 0 (the equal-weight scalar view rose):
  the same for every reward, since it reads the archive, not the shaping.

Printed, per reward over all groups: `corr_beats_parent` (Pearson correlation, over every completion of every
group, between its VPO advantage and whether it beat its parent; flat groups count, with advantage 0),
`vpo_differs_from_fixed_max` (share of groups in which some completion's VPO advantage and fixed-max advantage
differ by more than 1e-3: both are z-scores, so a difference is a different ranking or different spacing),
`flat_groups` (share of groups whose VPO advantages are all 0: no gradient). Then a table per problem and reward,
with the share of groups in which the two rankings differ, and, from the archives whose policy was never trained
(`none` arms, probes), the answers that beat their parent and the share of variance of the first principal
component of the valid children's normalised vectors (1.0 for one component): where it is near 1 the components
move together and no weighting can tell answers apart that an equal weighting does not. `typical_gain` is the
median, over valid children that changed their parent's scores, of the mean absolute gain per component: the size
of the improvement reward's waste penalty (policies/shaping.py WASTE_PENALTY).

    python -m benchmarks.reward_replay [--source DIR|FILE.tar.xz] [--pattern 'arms/*/arm.db']
    python -m benchmarks.reward_replay --smoke      # a tiny archive made in a temporary directory
"""

from __future__ import annotations

import argparse
import contextlib
import tarfile
import tempfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evolve.archive import Archive
from evolve.devtools.smoke_archive import smoke_archive as make_smoke_archive
from evolve.problem import load_problem
from evolve.training import load_batch, member_versions
from policies.advantages import MultiRLVR, vpo_advantages
from policies.shaping import shape_rewards
from policies.training_groups import TrainingGroup

KIND = "analysis"
SMOKE_ARGS = ("--smoke",)  # a run of seconds (python -m benchmarks --smoke)
HERE = Path(__file__).parent
STUDY = HERE / "results" / "closed_loop"
PROBLEM_DIRS = (HERE / "problems", HERE.parent / "problems")
STUDY_REWARD = {"normalisation": "group", "lazy_penalty": -0.5}


def rewards_for(penalties: list[float]) -> dict[str, dict[str, object]]:
    """The study's shaping, and the improvement reward at each waste penalty (the first: its default)."""
    out: dict[str, dict[str, object]] = {"study": STUDY_REWARD, "improvement": {"normalisation": "improvement"}}
    for penalty in penalties:
        out[f"improvement@{penalty:g}"] = {"normalisation": "improvement", "lazy_penalty": -abs(penalty)}
    return out


DIFFERS = 1e-3


@dataclass
class StoredArchive:
    name: str
    problem: str
    trained: bool  # some version of its run carries an adapter
    groups: list[TrainingGroup]


@dataclass
class Tally:
    """One reward's figures over a set of groups."""

    advantages: list[float] = field(default_factory=list)
    beat: list[bool] = field(default_factory=list)
    groups: int = 0
    flat: int = 0
    differs: int = 0
    ranking_differs: int = 0

    def corr(self) -> float:
        a, b = np.array(self.advantages), np.array(self.beat, dtype=float)
        if len(a) < 2 or a.std() == 0 or b.std() == 0:
            return float("nan")
        return float(np.corrcoef(a, b)[0, 1])

    def share(self, count: int) -> float:
        return 100.0 * count / self.groups if self.groups else float("nan")


@contextlib.contextmanager
def unpacked(source: Path) -> Iterator[Path]:
    """A directory of archives: `source` itself, or a `.tar.xz` unpacked into a temporary directory."""
    if source.is_dir():
        yield source
        return
    if not source.is_file() or not source.name.endswith((".tar.xz", ".tar")):
        raise SystemExit(f"--source {source}: give a directory of archives or a .tar.xz of them")
    with tempfile.TemporaryDirectory(prefix="reward-replay-") as tmp, tarfile.open(source) as tar:
        tar.extractall(tmp, filter="data")
        yield Path(tmp)


def problem_folder(name: str) -> Path:
    for root in PROBLEM_DIRS:
        if (root / name / "problem.toml").is_file():
            return root / name
    raise SystemExit(f"problem {name!r} of a stored run is in none of {', '.join(map(str, PROBLEM_DIRS))}")


def read_archive(path: Path, root: Path) -> StoredArchive:
    archive = Archive(path, create=False)
    try:
        run = archive.find_run(None)
        components = list(load_problem(problem_folder(run.problem_name)).components)
        versions = member_versions(archive, run.id, None)
        m = int(run.config.get("options", {}).get("variants", 1))
        batch = load_batch(archive, run.id, components, m, [v.id for v in versions])
        trained = any(v.adapter_path for v in versions)
        return StoredArchive(str(path.relative_to(root)), run.problem_name, trained, batch.groups)
    finally:
        archive.close()


def answer_gains(group: TrainingGroup) -> tuple[np.ndarray, np.ndarray]:
    """(G, m) mean gain over the parent in range units, and the (G, m) mask of valid children that changed the
    parent's scores (where the parent has a vector)."""
    rewards = group.rewards()
    changed = ~group.wasted() & ~group.unchanged()
    if group.parent is None:
        return np.zeros(rewards.shape[:2]), np.zeros(rewards.shape[:2], bool)
    return (rewards - group.parent).mean(axis=2), changed


def beat_parent(group: TrainingGroup) -> np.ndarray:
    """(G, m) answers whose child beat the parent on the equal-weight scalar view."""
    gains, changed = answer_gains(group)
    return changed & (gains > 0)


def differ(vpo: np.ndarray, fixed: np.ndarray) -> tuple[bool, bool]:
    """(some value differs by more than DIFFERS, the rankings differ)."""
    from scipy.stats import rankdata

    values = bool(np.max(np.abs(vpo - fixed)) > DIFFERS)
    ranks = not np.array_equal(rankdata(np.round(vpo, 6)), rankdata(np.round(fixed, 6)))
    return values, ranks


def replay(group: TrainingGroup, seed: int, reward: dict[str, object], tally: Tally) -> None:
    shaped = shape_rewards(
        group.rewards(),
        group.wasted(),
        parent=group.parent,
        unchanged=group.unchanged(),
        **reward,  # type: ignore[arg-type]
    )
    vpo = np.asarray(vpo_advantages(shaped, seed=seed))
    fixed = np.asarray(MultiRLVR()(shaped))
    values, ranks = differ(vpo, fixed)
    tally.groups += 1
    tally.flat += bool(np.all(vpo == 0))
    tally.differs += values
    tally.ranking_differs += ranks
    tally.advantages.extend(vpo.tolist())
    tally.beat.extend(beat_parent(group).any(axis=1).tolist())


def first_pc_share(vectors: np.ndarray, standardised: bool = False) -> float:
    """Share of the total variance along the first principal component of the vectors in range units (or of
    their correlation matrix: each component scaled to unit variance); nan under 3 vectors or no variance."""
    if len(vectors) < 3:
        return float("nan")
    if standardised:
        spread = vectors.std(axis=0)
        vectors = vectors[:, spread > 0] / spread[spread > 0]
        if vectors.shape[1] == 0:
            return float("nan")
    eig = np.linalg.eigvalsh(np.atleast_2d(np.cov(vectors, rowvar=False)))
    return float(eig[-1] / eig.sum()) if eig.sum() > 0 else float("nan")


@dataclass
class Untrained:
    """What the untrained policy's archives of one problem say about it."""

    vectors: list[np.ndarray] = field(default_factory=list)
    answers: int = 0
    beat: int = 0


def fmt(x: float, spec: str = ".3f") -> str:
    return "n/a" if np.isnan(x) else format(x, spec)


def report(archives: list[StoredArchive], rewards: dict[str, dict[str, object]]) -> None:
    overall = {name: Tally() for name in rewards}
    by_problem: dict[tuple[str, str], Tally] = defaultdict(Tally)
    untrained: dict[str, Untrained] = defaultdict(Untrained)
    gains: list[float] = []
    rises: list[float] = []  # the mean gain of each child that beat its parent
    for stored in archives:
        for gi, group in enumerate(stored.groups):
            for name, reward in rewards.items():
                replay(group, gi, reward, overall[name])
                replay(group, gi, reward, by_problem[stored.problem, name])
            mean_gain, changed = answer_gains(group)
            abs_gain = np.abs(group.rewards() - (0 if group.parent is None else group.parent)).mean(axis=2)
            gains.extend(abs_gain[changed].tolist())
            rises.extend(mean_gain[beat_parent(group)].tolist())
            if not stored.trained:
                seen = untrained[stored.problem]
                seen.answers += mean_gain.size
                seen.beat += int(beat_parent(group).sum())
                seen.vectors.extend(group.rewards()[~group.wasted()])
    for name, t in overall.items():
        print(
            f"reward_replay reward={name} corr_beats_parent={fmt(t.corr())} "
            f"vpo_differs_from_fixed_max={fmt(t.share(t.differs), '.1f')}% flat_groups={fmt(t.share(t.flat), '.1f')}% "
            f"groups={t.groups} archives={len(archives)}"
        )
    print(
        f"typical_gain={fmt(float(np.median(gains)) if gains else float('nan'), '.4f')} (median mean |gain| of "
        f"{len(gains)} valid children that changed their parent's scores, in range units); "
        f"median_rise={fmt(float(np.median(rises)) if rises else float('nan'), '.4f')} (median mean gain of the "
        f"{len(rises)} children that beat their parent)"
    )
    print()
    print(
        "| problem | reward | groups | corr_beats_parent | vpo differs from fixed max | rankings differ | flat "
        "groups | untrained: answers beating parent | untrained: first PC share (range units / correlation) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for (problem, name), t in sorted(by_problem.items()):
        seen = untrained.get(problem)
        beat = f"{seen.beat}/{seen.answers} ({100 * seen.beat / seen.answers:.1f}%)" if seen and seen.answers else "n/a"
        vectors = np.array(seen.vectors) if seen else np.zeros((0, 1))
        pc1 = f"{fmt(first_pc_share(vectors), '.2f')} / {fmt(first_pc_share(vectors, True), '.2f')}"
        print(
            f"| {problem} | {name} | {t.groups} | {fmt(t.corr())} | {fmt(t.share(t.differs), '.1f')}% | "
            f"{fmt(t.share(t.ranking_differs), '.1f')}% | {fmt(t.share(t.flat), '.1f')}% | {beat} | {pc1} |"
        )


SMOKE_PROBLEM = "minimizer"


def smoke_archive(path: Path, parents: int = 1) -> Path:
    """The tiny untrained archive of minimizer (evolve.devtools.smoke_archive) the smoke runs replay and train on."""
    return make_smoke_archive(path, problem_folder(SMOKE_PROBLEM), parents)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", type=Path, default=None, help="a directory of archives or a .tar.xz of them")
    ap.add_argument("--pattern", default="arms/*/arm.db", help="which files under the source are archives")
    ap.add_argument("--smoke", action="store_true", help="replay a tiny archive made in a temporary directory")
    ap.add_argument("--penalties", default="", help="also the improvement reward at these waste penalties (1e-3,0.04)")
    args = ap.parse_args(argv)
    rewards = rewards_for([float(x) for x in args.penalties.split(",") if x])
    if args.smoke:
        with tempfile.TemporaryDirectory(prefix="reward-replay-smoke-") as tmp:
            path = smoke_archive(Path(tmp) / "arms" / "smoke" / "arm.db")
            report([read_archive(path, Path(tmp))], rewards)
        return
    source = args.source or (STUDY if any(STUDY.glob(args.pattern)) else STUDY / "arms.tar.xz")
    with unpacked(source) as root:
        paths = sorted(p for p in root.glob(args.pattern) if ".stale-" not in str(p))
        if not paths:
            raise SystemExit(f"no archive matches {args.pattern!r} under {source}: unpack arms.tar.xz or pass --source")
        report([read_archive(p, root) for p in paths], rewards)


if __name__ == "__main__":
    main()
