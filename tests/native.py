"""A problem in C for the sandbox tests: the two cases of evolve.problem.samples (2 -> 4, 3 -> 9) and its
evaluator, built with cc.

Its build compiles the program and then runs it once with `--build` (as a build script or code generator
would), so a candidate controls what its build does: that is how the hostile builds below are written.
"""

from __future__ import annotations

from pathlib import Path

from evolve.filetree import join_files, split_files
from evolve.problem.samples import write_problem

C_TOML = """
name = "{name}"
description = "test problem in C"
[program]
file = "prog.c"
language = "c"
[build]
command = ["sh", "-c", "cc -O0 -o prog prog.c && ./prog --build"]
timeout_s = {build_timeout}
memory_mb = 256
max_file_mb = 16
[run]
command = ["./prog"]
[fitness]
components = [{{ name = "c0", bounds = [0.0, 1.0] }}, {{ name = "c1", bounds = [0.0, 1.0] }}]
[limits]
timeout_s = {timeout}
memory_mb = 512
max_processes = 32
"""

C_PROGRAM = """#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
{head}
// EVOLVE-BLOCK-START
static long solve(long x) {{ return {solve}; }}
// EVOLVE-BLOCK-END

int main(int argc, char **argv) {{
    if (argc > 1) {{ {build} return 0; }}
    {run}
    long x;
    if (scanf("%ld", &x) != 1) return 2;
    printf("%ld\\n", solve(x));
    return 0;
}}
"""


def c_program(solve: str = "x * x", *, build: str = "", run: str = "", head: str = "") -> str:
    """A C candidate: `solve`'s expression, plus what it does when built (`build`) or before each case (`run`)."""
    return C_PROGRAM.format(solve=solve, build=build, run=run, head=head)


KNOWN_C = [
    (c_program("x * x"), {"c0": 1.0, "c1": 1.0}),
    (c_program("4"), {"c0": 1.0, "c1": 0.0}),
    (c_program("9"), {"c0": 0.0, "c1": 1.0}),
    (c_program("-1"), {"c0": 0.0, "c1": 0.0}),
]


def write_c_problem(root: Path, *, timeout: float = 2.0, build_timeout: float = 2.0) -> Path:
    """The C problem in `root`: the seed squares its input; the evaluator is the samples' own (SPLIT_EVAL)."""
    toml = C_TOML.format(name=root.name, timeout=timeout, build_timeout=build_timeout)
    return write_problem(root, seed=KNOWN_C[0][0], toml=toml, program_file="prog.c")


def assert_known_c_vectors(sandbox: object, problem: object) -> None:
    """Each known C program, built and run one after another, gets exactly its own vector."""
    outcomes = [sandbox.evaluate(problem, code) for code, _ in KNOWN_C]  # type: ignore[attr-defined]
    got = [o.scores for o in outcomes]
    assert got == [want for _, want in KNOWN_C], [(o.scores, o.error_kind, (o.error or "")[-300:]) for o in outcomes]


# A compiled program of several files whose build writes into its subfolder (`cc -c lib/solve.c -o lib/solve.o`),
# as any build of more than one translation unit does. `lib/offset.h` is a fixed job file beside the candidate's.
TREE_TOML = """
name = "{name}"
description = "test problem in C, over several files"
[program]
files = ["main.c", "lib/"]
language = "c"
[build]
command = ["sh", "-c", "cc -c lib/solve.c -o lib/solve.o && cc -o prog main.c lib/solve.o && ./prog --build"]
timeout_s = 5
memory_mb = 256
max_file_mb = 16
[run]
command = ["./prog"]
[fitness]
components = [{{ name = "c0", bounds = [0.0, 1.0] }}, {{ name = "c1", bounds = [0.0, 1.0] }}]
[limits]
timeout_s = 5
memory_mb = 512
max_processes = 32
"""

TREE_MAIN = """#include <stdio.h>
#include "lib/offset.h"
long solve(long x);

int main(int argc, char **argv) {
    if (argc > 1) return 0;
    long x;
    if (scanf("%ld", &x) != 1) return 2;
    printf("%ld\\n", solve(x) + OFFSET);
    return 0;
}
"""

TREE_SOLVE = """{head}
// EVOLVE-BLOCK-START
long solve(long x) {{ return {solve}; }}
// EVOLVE-BLOCK-END
"""


def tree_program(solve: str = "x * x", head: str = "") -> str:
    """A candidate of the tree problem: its lib/solve.c returns `solve`, after `head` (C at file scope)."""
    return join_files(
        [
            ("main.c", TREE_MAIN),
            ("lib/offset.h", "#define OFFSET 0\n"),
            ("lib/solve.c", TREE_SOLVE.format(solve=solve, head=head)),
        ]
    )


KNOWN_TREE = [(tree_program("x * x"), {"c0": 1.0, "c1": 1.0}), (tree_program("4"), {"c0": 1.0, "c1": 0.0})]


def write_c_tree_problem(root: Path) -> Path:
    """The tree problem in `root`: the cases of `write_c_problem`, its seed the squaring `tree_program()`."""
    write_problem(root, seed="", toml=TREE_TOML.format(name=root.name), program_file="main.c")
    for path, text in split_files(tree_program()):  # main.c replaces the empty seed written above
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return root


def assert_known_tree_vectors(sandbox: object, problem: object) -> None:
    """Each known program of the tree problem, built and run one after another, gets exactly its own vector."""
    got = [sandbox.evaluate(problem, code).scores for code, _ in KNOWN_TREE]  # type: ignore[attr-defined]
    assert got == [want for _, want in KNOWN_TREE]
