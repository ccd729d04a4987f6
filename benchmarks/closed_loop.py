"""Does training the policy on its own archive help the search? The closed-loop experiment of issue 27.

Fixed before looking at any result (written here first, then run):
- **Arms.** `none` (the untrained policy), `grpo` and `vpo`: the same search (`evolve run`'s machinery, see
  closed_loop_arm.py) on the same problem and seed, the same sampling settings (each problem's own `[search]`,
  the ask fixed, no stall stop), the same number of groups per arm (`--groups`, 16: the budget is in samples,
  as the VPO paper and ThetaEvolve compare policies, so that a busy or slow machine changes the wall time, not
  the answer); the trained arms update the policy every `--update-every` groups (LoRA rank 8, learning rate
  1e-4, one optimizer step per group of 4: small steps). Wall time per part (sampling, evaluation, update, save,
  publish) is reported beside. Policy: the embedded Qwen2.5-Coder-0.5B-Instruct on llama.cpp
  (`llama:embedded`), trained through its bf16 copy.
- **Resumable.** Every finished arm is written to `--work`'s results.json at once; an arm cut off (Ctrl-C, a
  reboot, the end of a sitting) resumes from its own archive under `--work/arms/`; `--report` prints what the
  results file holds at any time. Run it niced in the background: `nice -n 19 python -m benchmarks.closed_loop
  --problems ... &`.
- **Reward shaping** (policies/shaping.py), the same for both trained arms: zero-advantage groups skipped,
  answers without a new valid program (copies, unparseable, failed) rewarded -0.5, each component stretched over
  its group
  (`--lazy-penalty`, `--reward-normalisation`, `--keep-zero-advantage` change it for a run of the study).
- **Problems, by rule.** Candidates, in this order: minimizer, tour_heuristic, durations, spread_points,
  bin_packing (benchmarks/problems and problems/, none written or tuned for this experiment). A candidate is kept
  when the untrained policy (`none`), run for the same `--groups` on the probe seed 100 (outside the
  benchmark's seeds 0, 1, 2, ...), makes at least 2 new valid children and ends below the problem's best known
  value (the scalar at every component's best declared bound). The study takes the first 3 kept. `--probe`
  runs this rule and prints the `--problems` value to use; the choice looks at the `none` arm only.
- **Held out.** Each arm's final policy answers `held_out_groups` groups from the seed of a problem that no arm
  trains on, `roman_numerals` (string processing: unlike the candidates), with the same sampling draws for every
  arm; reported as best of its k answers over that seed's scalar.
- **Reported.** Per arm, mean ± sd over problems x seeds: best/seed at the budget and its curve over groups, new
  valid children per group, new valid children per 1,000 tokens, archive diversity (mean pairwise distance of
  the valid programs' score vectors scaled by their bounds), held-out best@k over seed; wall time per part. Last
  the line `closed_loop none=... grpo=... vpo=... (best/seed, mean±sd over problems x seeds)` and the paired
  differences VPO-none and VPO-GRPO over (problem, seed) pairs with a 95% bootstrap interval.

Usage: python -m benchmarks.closed_loop --probe [--groups 16]
       python -m benchmarks.closed_loop --problems minimizer,tour_heuristic [--seeds 3] [--groups 16]
           [--update-every 1] [--work benchmarks/results/closed_loop]
       python -m benchmarks.closed_loop --report [--work ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import time
from dataclasses import asdict, fields
from pathlib import Path

import torch

from benchmarks.closed_loop_arm import ArmResult, ArmSettings, best_known, run_arm
from benchmarks.closed_loop_report import report
from evolve.problem import load_problem

KIND = "experiment"
SMOKE_ARGS = (
    "--problems",
    "minimizer",
    "--seeds",
    "1",
    "--groups",
    "1",
    "--arms",
    "none,vpo",
    "--held-out-groups",
    "0",
    "--policy",
    "transformers:{tiny_model}",
    "--max-new-tokens",
    "16",
    "--group-size",
    "2",
    "--train-epochs",
    "2",
    "--work",
    "{scratch}",
)  # a run of seconds (python -m benchmarks --smoke)

ROOT = Path(__file__).resolve().parent.parent
CANDIDATES = ("minimizer", "tour_heuristic", "durations", "spread_points", "bin_packing")
HELD_OUT = "roman_numerals"
PROBE_SEED = 100
ARMS = ("none", "grpo", "vpo")
STUDY_PROBLEMS = 3
MIN_NEW_VALID = 2
WORK = ROOT / "benchmarks" / "results" / "closed_loop"


def folder(name: str) -> Path:
    for base in (ROOT / "benchmarks" / "problems", ROOT / "problems"):
        if (base / name / "problem.toml").is_file():
            return base / name
    raise SystemExit(f"no problem {name!r} in benchmarks/problems or problems/")


def probe(settings: ArmSettings, candidates: list[str], work: Path) -> None:
    """The rule: the untrained arm on the probe seed; keep a candidate that makes new children and stalls. Each
    candidate's row goes to `work/probe.json` as it ends; a candidate cut off resumes from its archive."""
    out = work / "probe.json"
    rows = json.loads(out.read_text()) if out.is_file() else []
    for name in candidates:
        if sum(row["kept"] for row in rows) == STUDY_PROBLEMS:
            break
        if any(row["problem"] == load_problem(folder(name)).name for row in rows):
            continue
        r = run_arm(folder(name), "none", PROBE_SEED, settings, work / "probe" / name, None)
        ceiling = best_known(load_problem(folder(name)))
        keep = r.new_valid >= MIN_NEW_VALID and r.best_scalar < ceiling
        rows.append(asdict(r) | {"best_known": ceiling, "kept": keep, "name": name})
        out.write_text(json.dumps(rows, indent=1))
        print(
            f"probe {name}: {r.new_valid} new valid children, best {r.best_scalar:.4g} (seed {r.seed_scalar:.4g}, "
            f"best known {ceiling:.4g}) -> {'kept' if keep else 'left out'}; seconds {r.seconds}",
            flush=True,
        )
    kept = [row.get("name", row["problem"]) for row in rows if row["kept"]]
    print(f"probe chose --problems {','.join(kept)}")


CODE_PATHS = ("evolve", "policies", "sandboxes", "benchmarks", "problems", "pyproject.toml")  # what an arm runs
NOT_CODE = ":(exclude)benchmarks/results"


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise SystemExit("the closed loop records which code ran each arm: it needs git and a git checkout") from None


def code_version(rev: str = "HEAD") -> str:
    """What the arms' code is: a hash of the files under CODE_PATHS at `rev` (so a commit that changes only docs
    or tests keeps it), `-dirty-<hash of the changes>` when the work tree's code (untracked files in it too)
    differs from `rev`. An arm row from before these hashes names its commit; `same_code` reads it through this."""
    listing = _git("ls-tree", "-r", rev, "--", *CODE_PATHS)
    if listing.returncode != 0:
        raise SystemExit(f"cannot read the code of {rev}: {listing.stderr.strip()[:200]}")
    files = [line for line in listing.stdout.splitlines() if "\tbenchmarks/results/" not in line]
    version = hashlib.sha1("\n".join(files).encode()).hexdigest()[:12]
    if rev == "HEAD":
        changes = _git("status", "--porcelain", "--untracked-files=all", "--", *CODE_PATHS, NOT_CODE).stdout
        if changes:
            diff = _git("diff", "HEAD", "--", *CODE_PATHS, NOT_CODE).stdout
            version += "-dirty-" + hashlib.sha1((changes + diff).encode()).hexdigest()[:8]
    return version


def same_code(label: str, version: str) -> bool:
    """Whether an arm labelled `label` (a code hash, or the commit an older row named) ran `version`."""
    if label == version:
        return True
    if (
        label
        and all(c in "0123456789abcdef" for c in label)
        and _git("cat-file", "-e", f"{label}^{{commit}}").returncode == 0
    ):
        return code_version(label) == version
    return False


def restart_other_code(work: Path, version: str) -> None:
    """An arm's archive resumes whatever code began it: one begun by other code (its `code` file says) starts
    again, so that a finished row never pools sessions of different code."""
    stamp = work / "code"
    began = stamp.read_text().strip() if stamp.is_file() else None
    if began is not None and not same_code(began, version):
        set_aside(work, f"begun by other code ({began})")
    work.mkdir(parents=True, exist_ok=True)
    if not stamp.is_file():
        stamp.write_text(version + "\n")


def restart_without_adapter(work: Path) -> None:
    """A half-made trained arm resumes from its newest adapter. On another machine (a fresh clone, a new sitting)
    that adapter is gone while the archive that names it may have been kept: resumed, the arm would go on from the
    base weights under a later version number, a policy the study never trained. Such an arm starts again."""
    db = work / "arm.db"
    if not db.is_file():
        return
    query = "SELECT adapter_path FROM policy_versions WHERE adapter_path IS NOT NULL ORDER BY number DESC LIMIT 1"
    newest = [Path(p) for (p,) in sqlite_rows(db, query)]
    if newest and not newest[0].is_dir():
        set_aside(work, f"its newest adapter {newest[0]} is gone")


def set_aside(work: Path, why: str) -> None:
    """Move an arm's folder out of the way, kept for reading, so that the arm starts again from nothing."""
    aside = work.with_name(f"{work.name}.stale-{int(time.time())}")
    work.rename(aside)
    print(f"{work.name}: {why}; the arm starts again ({aside.name} kept)", flush=True)


def sqlite_rows(db: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(db)
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def probe_archive(name: str, settings: ArmSettings, work: Path) -> Path:
    """The untrained arm's archive of a problem on the probe seed (what `--probe` makes, and best@k trains and
    measures on), made or resumed under `work/probe/NAME` when a fresh machine does not have it."""
    run_arm(folder(name), "none", PROBE_SEED, settings, work / "probe" / name, None)
    return work / "probe" / name / "arm.db"


def load_results(path: Path) -> list[ArmResult]:
    """The finished arms a results file holds (none when it is missing)."""
    if not path.is_file():
        return []
    return [ArmResult(**row) for row in json.loads(path.read_text())]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", action="store_true", help="run the problem rule on the probe seed and stop")
    ap.add_argument("--report", action="store_true", help="print the report of the finished arms and stop")
    ap.add_argument("--probe-archive", default=None, help="make or resume a probe archive")
    ap.add_argument("--problems", default=None, help="comma-separated, as the probe chose them")
    ap.add_argument("--candidates", default=",".join(CANDIDATES), help="what the probe tries, in order (a pilot: one)")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--groups", type=int, default=ArmSettings.groups, help="the budget of every arm, in groups")
    ap.add_argument("--update-every", type=int, default=ArmSettings.update_every, help="groups between updates")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--policy", default=ArmSettings.policy)
    ap.add_argument("--learning-rate", type=float, default=ArmSettings.learning_rate)
    ap.add_argument("--lazy-penalty", type=float, default=ArmSettings.lazy_penalty)
    ap.add_argument("--reward-normalisation", default=ArmSettings.reward_normalisation)
    ap.add_argument("--keep-zero-advantage", action="store_true")
    ap.add_argument("--train-epochs", type=int, default=ArmSettings.epochs, help="PPO passes per update")
    ap.add_argument("--kl-coef", type=float, default=ArmSettings.kl_coef, help="KL term to the base model")
    ap.add_argument("--held-out-groups", type=int, default=ArmSettings.held_out_groups)
    ap.add_argument("--work", type=Path, default=WORK, help="results.json and the arms' archives (resumed from)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="smoke runs only (default: the problem's)")
    ap.add_argument("--group-size", type=int, default=None, help="smoke runs only (default: the problem's)")
    args = ap.parse_args()
    torch.set_num_threads(len(os.sched_getaffinity(0)))  # the trainer's threads: the cores this process may use
    settings = ArmSettings(
        policy=args.policy,
        groups=args.groups,
        update_every=args.update_every,
        learning_rate=args.learning_rate,
        skip_zero_advantage=not args.keep_zero_advantage,
        lazy_penalty=args.lazy_penalty,
        reward_normalisation=args.reward_normalisation,
        epochs=args.train_epochs,
        kl_coef=args.kl_coef,
        held_out_groups=args.held_out_groups,
        max_new_tokens=args.max_new_tokens,
        group_size=args.group_size,
    )
    results_path = args.work / "results.json"
    if args.report:
        report(load_results(results_path), settings)
        return
    if args.probe_archive:
        args.work.mkdir(parents=True, exist_ok=True)
        print(probe_archive(args.probe_archive, settings, args.work))
        return
    if args.probe:
        args.work.mkdir(parents=True, exist_ok=True)
        probe(settings, args.candidates.split(","), args.work)
        return
    if not args.problems:
        raise SystemExit("--problems: give the problems the probe chose (python -m benchmarks.closed_loop --probe)")
    args.work.mkdir(parents=True, exist_ok=True)
    started, results = time.time(), load_results(results_path)
    done = {(r.problem, r.seed, r.arm) for r in results}
    code = code_version()
    mixed = sorted({r.code or "unrecorded" for r in results if not same_code(r.code, code)})
    if mixed:  # the arms are compared as one search differing only in training: one code for all of them
        raise SystemExit(
            f"{results_path} holds arms run by other code ({', '.join(mixed)}; this is {code}): set them aside "
            "(move the file) or check that commit out to go on with them"
        )
    for seed in range(args.seeds):  # seed outermost: partial results pair every problem's arms early
        for name in args.problems.split(","):
            for arm in args.arms.split(","):
                if (load_problem(folder(name)).name, seed, arm) in done:
                    continue
                work = args.work / "arms" / f"{name}-s{seed}-{arm}"
                restart_without_adapter(work)
                restart_other_code(work, code)
                if code_version() != code:  # a long study outlives edits: lazily imported code would differ
                    raise SystemExit("the code changed while the study ran; run the same command again")
                try:
                    r = run_arm(folder(name), arm, seed, settings, work, folder(HELD_OUT))
                except KeyboardInterrupt as stop:  # the arm's archive keeps it: the same command resumes it
                    raise SystemExit(f"stopped ({stop or 'interrupted'}); run the same command to resume") from None
                r.code = code
                results.append(r)
                shown = {f.name: getattr(r, f.name) for f in fields(r) if f.name not in ("curve", "valid_per_group")}
                print(f"{name} seed {seed} {arm}: {shown} ({time.time() - started:.0f}s)", flush=True)
                results_path.write_text(json.dumps([asdict(x) for x in results], indent=1))
                keep_last_adapter(work / "adapters")
    report(results, settings)
    print(f"elapsed {time.time() - started:.0f}s")


def keep_last_adapter(adapters: Path) -> None:
    """Versions cost ~34 MB each (safetensors and GGUF) and the archive keeps their record; the trained policy
    itself (the last version) is kept, for best@k after the arm (`benchmarks.best_at_k --adapter`)."""
    versions = sorted((d for d in adapters.glob("v*") if d.name[1:].isdigit()), key=lambda d: int(d.name[1:]))
    for old in versions[:-1]:
        shutil.rmtree(old, ignore_errors=True)


if __name__ == "__main__":
    main()
