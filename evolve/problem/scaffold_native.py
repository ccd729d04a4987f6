"""`evolve init --language c|rust`: the same small problem as the Python template, as a program built once and
run once per case (the case's input as one JSON value on stdin, its output as one on stdout)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class NativeTemplate:
    seed_name: str
    seed: str
    build: list[str]
    build_timeout_s: int
    run: list[str]


C_SEED = """/* Built once per candidate; run once per case: one JSON number on stdin, one JSON number on stdout. */
#include <math.h>
#include <stdio.h>

// EVOLVE-BLOCK-START
static double solve(double x) {
    /* Return an estimate of f(x). */
    return x;
}
// EVOLVE-BLOCK-END

int main(void) {
    double x;
    if (scanf("%lf", &x) != 1) return 2;
    printf("%.17g\\n", solve(x));
    return 0;
}
"""

RUST_SEED = """// Built once per candidate; run once per case: one JSON number on stdin, one JSON number on stdout.
use std::io::Read;

// EVOLVE-BLOCK-START
fn solve(x: f64) -> f64 {
    // Return an estimate of f(x).
    x
}
// EVOLVE-BLOCK-END

fn main() {
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input).expect("read stdin");
    let x: f64 = input.trim().parse().expect("one number on stdin");
    println!("{:?}", solve(x));
}
"""

RUSTC = ["rustc", "--edition", "2021", "-O", "-C", "codegen-units=1", "-C", "strip=symbols"]
TEMPLATES = {
    "c": NativeTemplate("seed.c", C_SEED, ["gcc", "-O2", "-Wall", "-o", "seed", "seed.c", "-lm"], 30, ["./seed"]),
    "rust": NativeTemplate("seed.rs", RUST_SEED, [*RUSTC, "-o", "seed", "seed.rs"], 60, ["./seed"]),
}


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def native_sections(language: str) -> tuple[str, str, str]:
    """(the [program], [build] and [run] sections of problem.toml, the seed's name, the seed) for `language`."""
    t = TEMPLATES[language]
    toml = (
        f'[program]\nfile = "{t.seed_name}"\nlanguage = "{language}"\n\n'
        f"[build]  # runs in the sandbox, in the program's folder, under its own limits\n"
        f"command = {_toml_list(t.build)}\ntimeout_s = {t.build_timeout_s}\nmemory_mb = 1024\n\n"
        f"[run]  # once per case: the input as one JSON line on stdin, the output as one JSON value on stdout\n"
        f"command = {_toml_list(t.run)}\n"
    )
    return toml, t.seed_name, t.seed
