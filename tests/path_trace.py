"""The path of one child, traced: every call that crosses from one part of the engine to another while a run makes,
scores and stores one child, as the profiler sees it (no hand count).

Two runs of the square problem with the replay policy and the process sandbox, one group of one completion with
one variant, are traced with `sys.setprofile` on every thread: one with a group budget of 0 (the seed alone) and
one of 1 (the seed and one child). What the second makes beyond the first is the child's path. A crossing counts
once per (caller part, callee part, callee function), made by the loop or one of its stages (`PATH_PARTS`); the
calls a part makes inside itself, or that a library part makes to its own helpers, are left out. A thread hop is
an entry into engine code from the thread pool (`asyncio.to_thread`) or from a thread the engine started.

`python -m tests.path_trace` prints the table that docs/architecture.md holds; tests/test_architecture_path.py
fails when the two differ. It describes; it does not enforce: who may change run state is checked on the code's
syntax, every module, by tests/test_ledger_writers.py.
"""

from __future__ import annotations

import functools
import sys
import tempfile
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH_PARTS = ("evolve.loop", "evolve.flow", "evolve.group_sampler", "evolve.evaluation", "evolve.commit")
THREAD = "thread"
ANSWER = "<variant 1>\n```python\ndef solve(x):\n    return x * x\n```\n</variant 1>\n"


@dataclass(frozen=True, order=True)
class Crossing:
    caller: str  # a part, or "thread" for an entry from a worker thread
    callee: str
    function: str

    def row(self) -> str:
        return f"`{self.caller}` → `{self.callee}.{self.function}`"


def part_of(filename: str) -> str | None:
    """The part a source file belongs to: evolve's packages count as one part each, as do policies and sandboxes."""
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    top = rel.parts[0]
    if top in ("policies", "sandboxes"):
        return top
    if top != "evolve":
        return None
    return "evolve." + (rel.parts[1] if len(rel.parts) > 2 else rel.stem)


def _traced_run(folder: Path, groups: int) -> Counter[Crossing]:
    from evolve.loop import SearchLoop, run_search
    from policies.replay import ReplayPolicy
    from sandboxes.process import ProcessSandbox
    from tests.helpers import square_run

    problem, archive, run, options = square_run(
        folder, group_size=1, variants=1, max_evaluations=2, max_groups=groups, workers=1
    )
    loop = SearchLoop(problem, archive, ReplayPolicy([ANSWER]), ProcessSandbox(slots=1), run, options)
    loop.save_every_s = 3600.0  # the clock's state save is no part of a child's path (a loaded machine traced it)
    seen: Counter[Crossing] = Counter()
    main = threading.get_ident()

    def profile(frame, event, _arg):
        if event != "call" or (callee := part_of(frame.f_code.co_filename)) is None:
            return
        back = frame.f_back
        caller = part_of(back.f_code.co_filename) if back is not None else None
        function = frame.f_code.co_qualname
        if caller is None:
            from_pool = back is not None and ("concurrent/futures" in back.f_code.co_filename)
            started = back is not None and back.f_code.co_filename.endswith("threading.py")
            if threading.get_ident() != main and (from_pool or (started and callee.startswith("evolve."))):
                seen[Crossing(THREAD, callee, function)] += 1
        elif caller != callee:
            seen[Crossing(caller, callee, function)] += 1

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        run_search(loop)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        loop.sandbox.close()
        archive.close()
    return seen


@functools.cache
def child_path() -> list[Crossing]:
    """The crossings one child adds to a run, made by the loop or its stages, sorted (traced once per process)."""
    with tempfile.TemporaryDirectory() as seed_only, tempfile.TemporaryDirectory() as one_child:
        extra = _traced_run(Path(one_child), 1) - _traced_run(Path(seed_only), 0)
    return sorted(c for c in extra if c.caller in (*PATH_PARTS, THREAD))


def table(path: list[Crossing]) -> str:
    hops = [c for c in path if c.caller == THREAD]
    parts = {p for c in path for p in (c.caller, c.callee) if p != THREAD}
    lines = ["| # | caller → callee |", "|---|---|"]
    lines += [f"| {i} | {c.row()} |" for i, c in enumerate(path, start=1)]
    lines.append("")
    lines.append(f"{len(path) - len(hops)} calls over {len(parts)} parts, {len(hops)} thread hops.")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(child_path()))
