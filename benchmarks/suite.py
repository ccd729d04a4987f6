"""The benchmarks as one suite: which modules are benchmarks, what kind each is, and how each runs at smoke size.

A module of this folder is a benchmark when it runs as a script (`if __name__ == "__main__":`); the others are
its parts (closed_loop_arm.py, closed_loop_report.py) and the suite's own modules. Each benchmark declares, at its top:

- its protocol in its docstring, the first sentence saying what it answers or measures;
- `KIND`: "speed" (how fast a part of the engine is: a table of times or rates), "experiment" (does a method
  or a setting make the search or the policy better: arms compared on a fixed budget) or "analysis" (reads the
  archives or results another benchmark left and tabulates them);
- `SMOKE_ARGS`: the arguments of a run that takes seconds, so that CI runs every benchmark and none rots
  unnoticed (tests/test_benchmarks_smoke.py); `{tiny_model}` and `{study}` in them stand for a tiny model's
  folder and the unpacked closed-loop study (smoke_inputs.py);
- and it ends its output with its result line: its own name, then `key=value` figures.

The registry reads these from each module's syntax rather than importing it: listing the suite then costs no
torch import, and a new module (or one that does not import) is still listed, with what it lacks.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
KINDS = ("speed", "experiment", "analysis")
NOT_BENCHMARKS = {"__init__", "__main__", "suite", "runner", "smoke_inputs", "study_archives"}


@dataclass(frozen=True)
class Benchmark:
    """One runnable module of benchmarks/, as its source declares it."""

    name: str
    kind: str  # one of KINDS, or "" when the module does not declare KIND
    purpose: str  # the docstring's first sentence
    smoke_args: tuple[str, ...] | None  # None when the module declares no SMOKE_ARGS

    @property
    def module(self) -> str:
        return f"benchmarks.{self.name}"

    def problems(self) -> list[str]:
        """What the module lacks to be a benchmark of the suite, each a line naming the fix."""
        where = f"benchmarks/{self.name}.py"
        found = []
        if self.kind not in KINDS:
            found.append(f"{where}: declare KIND = one of {', '.join(repr(k) for k in KINDS)} at its top")
        if self.smoke_args is None:
            found.append(f"{where}: declare SMOKE_ARGS = (...): the arguments of a run of seconds")
        if not self.purpose:
            found.append(f"{where}: give it a docstring whose first sentence says what it answers")
        return found


def _constant(tree: ast.Module, name: str) -> object:
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and node.value is not None:
                try:
                    return ast.literal_eval(node.value)
                except ValueError:
                    return None
    return None


def _runs_as_script(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            names = [node.test.left, *node.test.comparators]
            if any(isinstance(n, ast.Name) and n.id == "__name__" for n in names):
                return True
    return False


def first_sentence(doc: str) -> str:
    """The docstring's first sentence, its lines joined (a sentence may wrap)."""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    match = re.match(r"(.+?[.?!])(\s|$)", paragraph)
    return match.group(1) if match else paragraph


def read_benchmark(path: Path) -> Benchmark | None:
    """The benchmark `path` declares, or None when it is not one (a part of another, or not a script)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    if not _runs_as_script(tree):
        return None
    kind = _constant(tree, "KIND")
    smoke = _constant(tree, "SMOKE_ARGS")
    doc = (ast.get_docstring(tree) or "").strip()
    return Benchmark(
        name=path.stem,
        kind=kind if isinstance(kind, str) else "",
        purpose=first_sentence(doc),
        smoke_args=tuple(str(a) for a in smoke) if isinstance(smoke, (list, tuple)) else None,
    )


def benchmarks(folder: Path = HERE) -> list[Benchmark]:
    """Every benchmark of the folder, found by scanning it (a new module is listed without being registered)."""
    found = []
    for path in sorted(folder.glob("*.py")):
        if path.stem not in NOT_BENCHMARKS and (bench := read_benchmark(path)) is not None:
            found.append(bench)
    return found


def by_name(name: str, folder: Path = HERE) -> Benchmark:
    """The benchmark called `name`; a one-line error naming the known ones otherwise."""
    known = benchmarks(folder)
    for bench in known:
        if bench.name == name:
            return bench
    raise SystemExit(f"no benchmark {name!r}: `python -m benchmarks` lists them ({', '.join(b.name for b in known)})")
