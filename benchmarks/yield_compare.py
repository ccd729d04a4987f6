"""Before and after, from kept archives: what two `benchmarks.yield --keep DIR` runs' children brought.

Reads every problem's archive (`<name>.db`, in DIR or a folder under it, as `--keep` lays them out) of the two
folders, with no problem folder and no model: each run's components, directions and bounds come from the config
its archive stored, and what the children brought (beats their parent, zero, same behaviour, new bests) from the
stored evaluations and parent links (`Archive.summarize`), so archives written by earlier code read the same way.
Prints each folder's per-problem table (benchmarks.yield's columns), a table of the headline figures side by side,
and the line docs/yield.md quotes:

`improvement beats_parent_per_1k_tokens_before=... after=... zero_share_before=...% after=...% new_best_before=N
after=N` (one line; pooled over the problems both folders hold); where they hold 2 to 20 runs in common (a problem
under one seed each), `paired units=n ..._diff=... p=...`: the mean change per run, after - before, with the exact
sign-flip p over the runs; then the suite's result line `yield_compare ...`.

Usage: python -m benchmarks.yield_compare BEFORE_DIR AFTER_DIR
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evolve.archive import Archive, ArchiveError
from evolve.devtools.exact_test import MAX_PAIRS, sign_flip_p
from evolve.report.aggregate import run_components

_yield = importlib.import_module("benchmarks.yield")  # `yield` is a keyword
ProblemYield = _yield.ProblemYield

KIND = "analysis"
SMOKE_ARGS = ("{study}/after_loop", "{study}/after_loop")  # any two kept folders: the study's are at hand


class KeptError(Exception):
    """A folder or archive that cannot be compared: the message says which and what to do."""


def kept_runs(folder: Path) -> dict[str, ProblemYield]:
    """Each archive under `folder` (its path without `.db`, relative to the folder) → its latest run's figures."""
    if not folder.is_dir():
        raise KeptError(f"{folder}: no such folder; give a folder that `benchmarks.yield --keep` wrote")
    out: dict[str, ProblemYield] = {}
    for db in sorted(folder.rglob("*.db")):
        key = str(db.relative_to(folder).with_suffix(""))
        try:
            archive = Archive(db, create=False)
        except ArchiveError as exc:
            raise KeptError(f"{db}: {exc}") from exc
        try:
            runs = archive.runs()
            if not runs:
                continue
            run = runs[-1]
            try:
                components = run_components(run)
            except (KeyError, TypeError, ValueError) as exc:
                raise KeptError(f"{db}: run {run.id} stored no readable fitness config ({exc})") from exc
            reason = run.state.stop_reason or run.status
            out[key] = _yield.stored_yield(key, archive, run, components, run.state.elapsed_s, reason)
        finally:
            archive.close()
    if not out:
        raise KeptError(f"{folder}: no archive with a run in it (looked for <problem>.db files)")
    return out


def problem_table(title: str, runs: dict[str, ProblemYield]) -> Table:
    table = Table(title=title)
    for col in _yield.COLUMNS:
        table.add_column(col, justify="left" if col == "problem" else "right")
    for r in runs.values():
        table.add_row(*r.row())
    return table


def side_by_side(before: dict[str, ProblemYield], after: dict[str, ProblemYield]) -> Table:
    """Per problem both folders hold: the headline figures before → after."""
    table = Table(title="before -> after")
    for col in ("problem", "beats_parent", "beats /1k tok", "zero share", "same behaviour", "new bests"):
        table.add_column(col, justify="left" if col == "problem" else "right")
    for name in sorted(set(before) & set(after)):
        b, a = before[name].yields, after[name].yields
        table.add_row(
            name,
            f"{b.quality.beats_parent} -> {a.quality.beats_parent}",
            f"{b.beats_parent_per_1k_tokens:.2f} -> {a.beats_parent_per_1k_tokens:.2f}",
            f"{b.zero_share:.0%} -> {a.zero_share:.0%}",
            f"{b.quality.same} -> {a.quality.same}",
            f"{b.quality.new_best} -> {a.quality.new_best}",
        )
    return table


def improvement_line(before: dict[str, ProblemYield], after: dict[str, ProblemYield]) -> str:
    """Pooled over the problems both folders hold (a problem run only once says nothing of a change)."""
    common = sorted(set(before) & set(after))
    if not common:
        raise KeptError("the two folders hold no problem in common: compare runs of the same problems")
    b = _yield.pooled([before[n] for n in common])
    a = _yield.pooled([after[n] for n in common])
    return (
        f"improvement beats_parent_per_1k_tokens_before={b.beats_parent_per_1k_tokens:.3f} "
        f"after={a.beats_parent_per_1k_tokens:.3f} zero_share_before={100 * b.zero_share:.1f}% "
        f"after={100 * a.zero_share:.1f}% new_best_before={b.quality.new_best} after={a.quality.new_best}"
    )


def paired_line(before: dict[str, ProblemYield], after: dict[str, ProblemYield]) -> str | None:
    """The change per unit both folders hold (a problem under one seed: independent runs), after - before, with the
    exact sign-flip p over the units; None with fewer than 2 units or more than the exact test enumerates."""
    common = sorted(set(before) & set(after))
    if not 2 <= len(common) <= MAX_PAIRS:
        return None
    beats = [after[n].yields.beats_parent_per_1k_tokens - before[n].yields.beats_parent_per_1k_tokens for n in common]
    zero = [after[n].yields.zero_share - before[n].yields.zero_share for n in common]
    return (
        f"paired units={len(common)} beats_parent_per_1k_tokens_diff={sum(beats) / len(beats):+.3f} "
        f"p={sign_flip_p(beats):.3f} zero_share_diff={100 * sum(zero) / len(zero):+.1f}% p={sign_flip_p(zero):.3f}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="the --keep folder of the run before the change")
    ap.add_argument("after", type=Path, help="the --keep folder of the run after it")
    args = ap.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 220)
    try:
        before, after = kept_runs(args.before), kept_runs(args.after)
        line = improvement_line(before, after)
    except KeptError as exc:
        print(f"yield_compare: {exc}", file=sys.stderr)
        return 2
    console.print(problem_table(f"before: {args.before}", before))
    console.print(problem_table(f"after: {args.after}", after))
    console.print(side_by_side(before, after))
    print(line)
    paired = paired_line(before, after)
    if paired is not None:
        print(paired)
    print(f"yield_compare problems_before={len(before)} problems_after={len(after)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
