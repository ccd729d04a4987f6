"""A problem in C for the sandbox tests: the two cases of evolve.problem.samples (2 -> 4, 3 -> 9) and its
evaluator, built with cc.

Its build compiles the program and then runs it once with `--build` (as a build script or code generator
would), so a candidate controls what its build does: that is how the hostile builds below are written.
"""

from __future__ import annotations

from pathlib import Path

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
    got = [sandbox.evaluate(problem, code).scores for code, _ in KNOWN_C]  # type: ignore[attr-defined]
    assert got == [want for _, want in KNOWN_C]
