"""The trusted side of simple-form evaluators: what a job carries beyond the program, and how the numbers
a sandboxed `evaluate()` returned become the problem's score vector.

The sandbox may return fewer or more numbers than the problem has components (OpenEvolve evaluators return
other keys on failure, or stop a cascade early). A missing component takes its fail value; numbers under
other names become feedback; what the evaluator said in words always reaches the model as feedback.
"""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path
from typing import Any

from evolve.problem import Problem
from evolve.problem.outcome import ErrorKind, EvalOutcome

HERE = Path(__file__).resolve().parent
SHIPPED_MODULES = {"_evolve_simple": "simple_results.py", "openevolve.evaluation_result": "openevolve_shim.py"}


@cache
def shipped_sources() -> dict[str, str]:
    """Sources the harness installs as modules before it imports the evaluator (stdlib-only files of ours)."""
    return {name: (HERE / file).read_text() for name, file in SHIPPED_MODULES.items()}


def simple_job_extras(problem: Problem) -> dict[str, Any]:
    """What a simple-form job carries besides the program and evaluator paths: our modules, and the cascade."""
    ev = problem.config.evaluator
    extras: dict[str, Any] = {"modules": shipped_sources()}
    if ev.cascade:
        extras["cascade"] = {"thresholds": list(ev.cascade_thresholds)}
    return extras


def _bad(problem: Problem, error: str, duration_s: float, sandbox: str, feedback: str | None) -> EvalOutcome:
    scores = {c.name: c.failure for c in problem.components}
    return EvalOutcome(scores, ErrorKind.BAD_OUTPUT, error[:2000], duration_s, sandbox, feedback=feedback)


def check_simple(problem: Problem, reply: dict[str, Any], duration_s: float, sandbox: str) -> EvalOutcome:
    raw = reply.get("scores")
    if not isinstance(raw, dict):
        return _bad(problem, "evaluate() returned no scores", duration_s, sandbox, None)
    try:
        numbers = {str(k): float(v) for k, v in raw.items() if isinstance(v, int | float)}
    except OverflowError:  # an int too large for a float
        return _bad(problem, "evaluate() returned an integer too large for a float", duration_s, sandbox, None)
    said = reply.get("feedback") if isinstance(reply.get("feedback"), str) else None
    incomplete = reply.get("incomplete") if isinstance(reply.get("incomplete"), str) else None
    stages = reply.get("stages") if isinstance(reply.get("stages"), list) else None
    lenient = problem.config.evaluator.names == "lenient"
    want = problem.component_names
    missing = [n for n in want if n not in numbers]
    extra = [k for k in numbers if k not in set(want)]
    if (missing or extra) and not (lenient or incomplete):
        return _bad(
            problem,
            f"evaluate() returned the wrong names (missing {missing[:3]}, unexpected {extra[:3]})",
            duration_s,
            sandbox,
            said,
        )
    bad = [n for n in want if n in numbers and not math.isfinite(numbers[n])]
    if bad:
        return _bad(problem, f"evaluate() returned non-finite {bad[:3]}", duration_s, sandbox, said)
    outside = [
        c.name
        for c in problem.components
        if c.bounds is not None and c.name in numbers and not c.bounds[0] <= numbers[c.name] <= c.bounds[1]
    ]
    if outside:  # the evaluator broke its own contract (or was fooled): never let it beat an honest best
        return _bad(
            problem, f"evaluate() returned values outside their bounds: {outside[:3]}", duration_s, sandbox, said
        )
    notes = [said] if said else []
    if missing:
        notes.append(f"not returned, scored as failures: {', '.join(missing[:20])}")
    if extra:
        notes.append("other metrics: " + ", ".join(f"{k}={numbers[k]:.6g}" for k in extra[:20]))
    feedback = "\n".join(notes) or None
    scores = {c.name: numbers.get(c.name, c.failure) for c in problem.components}
    outcome = EvalOutcome(scores, None, None, duration_s, sandbox, feedback=feedback, metrics=numbers, stages=stages)
    if want and len(missing) == len(want) and not stages:
        # Nothing of the vector came back: the evaluator judged the program unusable and said why.
        outcome.error_kind = ErrorKind.INVALID if incomplete else ErrorKind.BAD_OUTPUT
        outcome.error = (said or incomplete or "evaluate() returned none of the components")[:2000]
    return outcome
