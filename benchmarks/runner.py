"""Running benchmarks of the suite by name, one after the other in this one process, and checking each ended with
its result line.

One process, not one per benchmark: most of them import torch and the engine, which takes seconds, and tens of
seconds on a loaded machine; paid once, the smoke run of the whole suite stays short. Each benchmark runs as
`python -m benchmarks.NAME` would run it (`runpy`, its `__main__` block, `sys.argv` set), between two marker lines
that tests/test_benchmarks_smoke.py reads:

    == NAME: python -m benchmarks.NAME ARGS
    ... what it prints ...
    == NAME ok|failed (why) in S s
"""

from __future__ import annotations

import io
import runpy
import sys
import time
import traceback
from dataclasses import dataclass

from benchmarks.suite import Benchmark


@dataclass(frozen=True)
class RunResult:
    name: str
    ok: bool
    why: str  # empty when ok
    seconds: float


class _Tee(io.TextIOBase):
    """Writes through to the real stream and keeps a copy, to find the result line afterwards."""

    def __init__(self, through: io.TextIOBase) -> None:
        self.through, self.kept = through, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.through.write(text)

    def flush(self) -> None:
        self.through.flush()

    def isatty(self) -> bool:
        return False


def result_line(name: str, output: str) -> str | None:
    """The benchmark's result line: the last line that opens with its name and a space."""
    lines = [line for line in output.splitlines() if line.startswith(f"{name} ")]
    return lines[-1] if lines else None


def run_benchmark(bench: Benchmark, args: list[str]) -> RunResult:
    """Run one benchmark with `args` in this process; its failure is reported, not raised."""
    print(f"== {bench.name}: python -m {bench.module} {' '.join(args)}".rstrip(), flush=True)
    start = time.monotonic()
    real_out, real_argv = sys.stdout, sys.argv
    tee = _Tee(real_out)
    why = ""
    sys.stdout, sys.argv = tee, [bench.module, *args]
    try:
        runpy.run_module(bench.module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            why = f"exit {exc.code}"
    except KeyboardInterrupt:
        raise
    except Exception as exc:  # one benchmark's crash is its row of the report, not the suite's end
        traceback.print_exc()
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")
    finally:
        sys.stdout, sys.argv = real_out, real_argv
    if not why and result_line(bench.name, tee.kept.getvalue()) is None:
        why = f"no result line (a line opening with '{bench.name} ')"
    seconds = time.monotonic() - start
    print(f"== {bench.name} {'ok' if not why else f'failed ({why})'} in {seconds:.1f} s", flush=True)
    return RunResult(bench.name, not why, why, seconds)
