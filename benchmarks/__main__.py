"""`python -m benchmarks`: list the suite; `python -m benchmarks NAME [ARGS]`: run one; `--smoke`: run each at
smoke size (its SMOKE_ARGS), or only the NAMEs given after `--smoke`.

See benchmarks/README.md for the kinds and each benchmark's protocol (its module's docstring).
"""

from __future__ import annotations

import sys
import time

from benchmarks.suite import KINDS, Benchmark, benchmarks, by_name

PURPOSE_WIDTH = 100  # a docstring's first sentence may run long: the listing keeps one line each
USAGE = "usage: python -m benchmarks [NAME [ARGS ...] | --smoke [NAME ...]]"


def listing(found: list[Benchmark]) -> None:
    width = max(len(b.name) for b in found)
    for kind in (*KINDS, ""):
        members = [b for b in found if b.kind == kind]
        if not members:
            continue
        print(f"{kind or 'undeclared (no KIND)'}:")
        for bench in members:
            purpose = bench.purpose if len(bench.purpose) <= PURPOSE_WIDTH else bench.purpose[: PURPOSE_WIDTH - 1] + "…"
            print(f"  {bench.name:{width}}  {purpose}")
    lacking = [line for b in found for line in b.problems()]
    for line in lacking:
        print(f"! {line}")
    print(f"benchmarks listed={len(found)} " + " ".join(f"{k}={sum(b.kind == k for b in found)}" for k in KINDS))


def smoke(names: list[str]) -> int:
    from benchmarks.runner import run_benchmark
    from benchmarks.smoke_inputs import filled

    chosen = [by_name(n) for n in names] if names else benchmarks()
    start, results = time.monotonic(), []
    for bench in chosen:
        if bench.problems():
            print(f"== {bench.name} failed ({'; '.join(bench.problems())})", flush=True)
            continue
        results.append(run_benchmark(bench, filled(bench.smoke_args or ())))
    failed = [r.name for r in results if not r.ok]
    failed += [b.name for b in chosen if b.problems()]
    print("\n".join(f"{r.name:24} {'ok' if r.ok else 'FAILED ' + r.why} {r.seconds:.1f} s" for r in results))
    print(f"smoke ran={len(chosen)} failed={len(failed)} seconds={time.monotonic() - start:.1f}", flush=True)
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if not argv:
        listing(benchmarks())
        return 0
    if argv[0] in ("-h", "--help"):
        print(__doc__ + "\n" + USAGE)
        return 0
    if argv[0] == "--smoke":
        return smoke(argv[1:])
    if argv[0].startswith("-"):
        raise SystemExit(f"unknown option {argv[0]!r}; {USAGE}")
    from benchmarks.runner import run_benchmark

    result = run_benchmark(by_name(argv[0]), argv[1:])
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
