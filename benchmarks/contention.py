"""Sampling while a candidate burns a core: tokens per second of the llama.cpp policy, and the candidate's
evaluation time, alone and together, under the ways the two can share the CPU.

Protocol. One policy (`--policy`, default the embedded model through llama.cpp) samples groups of `--rows` rows
of one fixed coding prompt, `--max-new-tokens` each, after one warm-up group (the prompt is then cached, as in
a run's later groups). A candidate burns `--burn-s` seconds of CPU time in one process (a busy loop at import:
a fixed amount of work, so its wall time grows with the CPU it is refused), evaluated in the real process
sandbox (bubblewrap where it runs, one slot).

- idle sampling: groups sampled back to back for `--idle-s` seconds (the group in flight then stops): tokens
  over wall time;
- idle evaluation: the candidate evaluated with nothing else running: its wall time;
- each arm: the candidate evaluated in a thread while groups are sampled back to back from the moment it starts
  to the moment it ends (the group in flight then stops): the tokens sampled in that window over its length,
  and the evaluation's wall time.

Arms: `today` (decoding on every core, the candidate at nice 0: how it was), `nice` (the candidate at nice 10,
with its session's autogroup), `threads` (decoding leaves a core to each evaluation in flight),
`both`. The last line is what a run does (`threads`: a lower weight starved the candidate whenever anything
else ran on the machine, docs/policies.md):
`contention tok_s_idle=... tok_s_busy=... ratio=... eval_s_idle=... eval_s_busy=...`. Goal: ratio >= 0.5,
eval_s_busy <= 2 x eval_s_idle. The machine's load average before the run is printed: run it on a quiet machine.

Usage: python -m benchmarks.contention [--burn-s 60] [--max-new-tokens 256] [--rows 4] [--idle-s 20]
       [--arms today,both | all] [--policy llama:embedded] [--smoke]
`--smoke`: a burn of 2 s, 16 tokens a row, 2 rows, 2 s idle: the whole protocol in seconds, for CI.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evolve.problem import Problem, load_problem
from evolve.problem.samples import write_problem
from policies.from_spec import make_policy
from policies.llama_policy import LlamaPolicy
from policies.policy import SamplingParams
from sandboxes.cpu_share import CANDIDATE_NICE
from sandboxes.jail import find_jail
from sandboxes.process import ProcessSandbox

KIND = "speed"
SMOKE_ARGS = ("--smoke",)  # a run of seconds (python -m benchmarks --smoke)

PROMPT = (
    "Write a Python function `pack(weights, capacity)` that puts items of the given weights into as few bins of "
    "the given capacity as it can (first-fit decreasing, then try to improve it). Explain the idea briefly, then "
    "give the whole function in one fenced code block."
)
BURNER = """
import time
_start = time.process_time()
while time.process_time() - _start < {burn_s}:
    pass

def solve(x):
    return x * x
"""
ARMS = {"today": (0, False), "nice": (CANDIDATE_NICE, False), "threads": (0, True), "both": (CANDIDATE_NICE, True)}
SHIPPED = "threads"  # picked by this benchmark: see docs/policies.md


@dataclass(frozen=True)
class Window:
    """Tokens sampled over a stretch of wall time, and what the candidate took meanwhile (None: none ran)."""

    tokens: int
    seconds: float
    eval_s: float | None = None
    threads: int = 0  # the decoding threads most of the time the candidate ran

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def _group(policy: LlamaPolicy, params: SamplingParams, rows: int) -> int:
    """One group (or the part of it sampled before an interrupt): the tokens it sampled."""
    policy.generate(PROMPT, params, rows)
    return policy.progress.tokens


def sample_alone(policy: LlamaPolicy, params: SamplingParams, rows: int, seconds: float) -> Window:
    """Groups sampled back to back for `seconds`; the group in flight then stops (a loaded machine may take
    minutes for one group)."""
    ended = threading.Event()

    def end() -> None:
        ended.set()
        policy.interrupt()

    timer = threading.Timer(seconds, end)
    tokens, start = 0, time.monotonic()
    timer.start()
    while not ended.is_set():
        tokens += _group(policy, params, rows)
    took = time.monotonic() - start
    timer.join()
    policy.withdraw_interrupt()
    return Window(tokens, took)


class CandidateFailed(Exception):
    pass


def evaluate_alone(sandbox: ProcessSandbox, problem: Problem, code: str) -> float:
    start = time.monotonic()
    outcome = sandbox.evaluate(problem, code)
    if outcome.scores != {"c0": 1.0, "c1": 1.0}:
        said = f"{outcome.error_kind} {outcome.error} {outcome.stderr[-300:]}"
        raise CandidateFailed(f"the burning candidate failed after {time.monotonic() - start:.0f} s: {said}")
    return time.monotonic() - start


def sample_during(
    policy: LlamaPolicy, params: SamplingParams, rows: int, sandbox: ProcessSandbox, problem: Problem, code: str
) -> Window:
    """Groups sampled back to back while the candidate is evaluated; the group in flight stops when it ends."""
    done = threading.Event()
    took: list[float] = []
    failed: list[str] = []
    threads_seen: list[int] = []

    def evaluate() -> None:
        try:
            took.append(evaluate_alone(sandbox, problem, code))
        except CandidateFailed as exc:
            failed.append(str(exc))
        finally:
            done.set()
            policy.interrupt()

    def watch_threads() -> None:  # what the runtime would decode with, while the candidate runs
        while not done.wait(0.05):
            threads_seen.append(policy.cores.threads())

    worker = threading.Thread(target=evaluate, daemon=True)
    watcher = threading.Thread(target=watch_threads, daemon=True)
    start = time.monotonic()
    worker.start()
    watcher.start()
    tokens = 0
    while not done.is_set():
        tokens += _group(policy, params, rows)
    seconds = time.monotonic() - start
    worker.join()
    policy.withdraw_interrupt()
    if not took:
        raise SystemExit(failed[0] if failed else "the burning candidate's evaluation raised (see above)")
    most = max(set(threads_seen), key=threads_seen.count) if threads_seen else 0
    return Window(tokens, seconds, took[0], most)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--burn-s", type=float, default=60.0)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--idle-s", type=float, default=20.0)
    parser.add_argument("--arms", default=f"today,{SHIPPED}", help=f"comma-separated of {', '.join(ARMS)}, or all")
    parser.add_argument("--policy", default="llama:embedded")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.burn_s, args.max_new_tokens, args.rows, args.idle_s = 2.0, 16, 2, 2.0
    arms = list(ARMS) if args.arms == "all" else [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"--arms: unknown {', '.join(unknown)}; use {', '.join(ARMS)} or all")
    if SHIPPED not in arms:
        arms.append(SHIPPED)

    console = Console(width=120)
    load = os.getloadavg()[0]
    cores = len(os.sched_getaffinity(0))
    policy = make_policy(args.policy)
    if not isinstance(policy, LlamaPolicy):
        raise SystemExit(f"--policy {args.policy}: a llama.cpp policy (llama:embedded or llama:PATH.gguf)")
    params = SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=args.max_new_tokens, seed=None)
    code = BURNER.format(burn_s=args.burn_s)
    folder = write_problem(Path(tempfile.mkdtemp()) / "contention", seed=code, timeout=args.burn_s * 100 + 60)
    problem = load_problem(folder)
    jailed = find_jail()[0] is not None
    console.print(
        f"machine: {cores} cores, load average {load:.2f} before the run; candidate burns {args.burn_s:g} CPU s "
        f"in the process sandbox ({'bubblewrap' if jailed else 'WEAK'}); {policy.description}"
    )
    try:
        _group(policy, replace(params, max_new_tokens=1), args.rows)  # warm-up: the prompt decoded and cached
        sandbox = ProcessSandbox(slots=1, jail=jailed)
        try:
            policy.share_cores(sandbox.evaluations_in_flight)
            idle = sample_alone(policy, params, args.rows, args.idle_s)
            try:
                eval_idle = evaluate_alone(sandbox, problem, code)
            except CandidateFailed as exc:
                raise SystemExit(str(exc)) from None
        finally:
            sandbox.close()
        busy: dict[str, Window] = {}
        for arm in arms:
            nice, yields = ARMS[arm]
            sandbox = ProcessSandbox(slots=1, jail=jailed, nice=nice)
            try:
                policy.share_cores(sandbox.evaluations_in_flight if yields else (lambda: 0))
                busy[arm] = sample_during(policy, params, args.rows, sandbox, problem, code)
            finally:
                sandbox.close()
    finally:
        policy.close()

    table = Table("arm", "candidate nice", "decoding threads", "tokens", "window s", "tok/s", "ratio", "eval s")
    table.add_column("x idle")
    idle_cells = (str(idle.tokens), f"{idle.seconds:.1f}", f"{idle.tok_s:.1f}")
    table.add_row("idle", "-", str(policy.threads), *idle_cells, "1.00")
    table.add_row("idle evaluation", "0", "-", "-", "-", "-", "-", f"{eval_idle:.1f}", "1.00")
    for arm, w in busy.items():
        nice, _ = ARMS[arm]
        ratio, slow = w.tok_s / idle.tok_s if idle.tok_s else 0.0, (w.eval_s or 0.0) / eval_idle
        table.add_row(
            arm, str(nice), str(w.threads), str(w.tokens), f"{w.seconds:.1f}", f"{w.tok_s:.1f}", f"{ratio:.2f}",
            f"{w.eval_s:.1f}", f"{slow:.2f}",
        )  # fmt: skip
    console.print(table)
    shipped = busy[SHIPPED]
    print(
        f"contention tok_s_idle={idle.tok_s:.2f} tok_s_busy={shipped.tok_s:.2f} "
        f"ratio={shipped.tok_s / idle.tok_s if idle.tok_s else 0.0:.2f} "
        f"eval_s_idle={eval_idle:.2f} eval_s_busy={shipped.eval_s:.2f}"
    )


if __name__ == "__main__":
    main()
