"""Trusted scoring: what goes into a sandbox, and how its raw reply becomes a score vector. It runs no code.

Backends only move a job in and a reply out; everything that decides a score lives here, so the process and
Docker sandboxes score identically.
"""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache
from pathlib import Path, PurePosixPath
from typing import Any

from evolve.filetree import TreeError, split_files
from evolve.fitness import scalar_view
from evolve.problem import Problem
from evolve.problem.blocks import find_blocks
from evolve.problem.fixed_code import interface_names
from evolve.problem.outcome import (
    FIRST_CALL_CAP,
    FIRST_CALLS_CAP,
    ErrorKind,
    EvalOutcome,
    SwallowedError,
    most_frequent,
)
from evolve.storable import storable_text
from sandboxes.reply_shape import malformed
from sandboxes.simple_form import check_simple, simple_job_extras
from sandboxes.toolchain import Toolchain

HARNESS_PATH = Path(__file__).with_name("harness.py")
NATIVE_RUNNER = Path(__file__).with_name("native_run.py")
ESCAPES = Path(__file__).with_name("escapes.py")  # what the candidate's code raised: the reply's `swallowed`
FIRST_CALLS = Path(__file__).with_name("first_calls.py")  # the seed's first calls: the reply's `first_calls`


@cache
def _native_runner_source() -> str:
    return NATIVE_RUNNER.read_text()


@cache
def _escapes_source() -> str:
    return ESCAPES.read_text()


@cache
def _first_calls_source() -> str:
    return FIRST_CALLS.read_text()


def program_filename(problem: Problem) -> str:
    """Where the program's entry file lies in the work folder (a relative path for a program of several files)."""
    if problem.multi_file:
        return problem.config.program.entry
    return Path(problem.config.program.file).name


def program_files(problem: Problem, code: str) -> dict[str, str]:
    """The files to lay out in the work folder for `code`: relative path -> text. A program of several files is
    split and checked again here, whoever made it (evolve/filetree.py: relative paths inside the program, the
    limits), and must have exactly the problem's files; TreeError, a one-line reason, otherwise."""
    try:
        code.encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate: no file can hold it, and writing one raised
        raise TreeError(f"the program is not valid UTF-8 text (position {exc.start}); remove that character") from None
    if not problem.multi_file:
        return {program_filename(problem): code}
    files = dict(split_files(code))
    if tuple(files) != problem.files:
        unknown = sorted(set(files) - set(problem.files))[:3]
        lacking = sorted(set(problem.files) - set(files))[:3]
        raise TreeError(f"the program's files differ from the problem's (unknown {unknown}, missing {lacking})")
    return files


def make_job(
    problem: Problem,
    program_path: str,
    evaluator_path: str | None,
    workdir: str,
    toolchain: Toolchain | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    """The job a harness runs. Split form carries case inputs only, never the trusted extras. A problem with
    `[run]` also carries its commands (as `toolchain` starts them in this sandbox) and the runner that builds
    and runs them (sandboxes/native_run.py). When `code` is the problem's own seed (a Python program of one file),
    the job also asks for the first call of each function its fixed code calls (sandboxes/first_calls.py)."""
    job: dict[str, Any] = {"program": program_path, "workdir": workdir, "mode": problem.form}
    # The program's own files: what escapes code of theirs is recorded (the reply's `swallowed`, harness.py).
    others = [str(PurePosixPath(workdir, f)) for f in problem.files if f != program_filename(problem)]
    job["candidate_files"] = [program_path, *others] if problem.multi_file else [program_path]
    if problem.form == "split":
        job["entry_point"] = problem.config.program.entry_point
        job["inputs"] = [[c.name, c.input] for c in problem.cases]
        if problem.config.limits.case_timeout_s is not None:
            job["case_timeout_s"] = problem.config.limits.case_timeout_s
    else:
        job["evaluator"] = evaluator_path
        job.update(simple_job_extras(problem))
    if problem.config.native:
        job["native"] = native_section(problem, toolchain or Toolchain())
        job["modules"] = {**job.get("modules", {}), "_evolve_native": _native_runner_source()}
    else:
        job["modules"] = {**job.get("modules", {}), "_evolve_escapes": _escapes_source()}
        asked = first_calls_asked(problem) if code == problem.seed_code and not problem.multi_file else None
        if asked is not None:
            job["first_calls"] = asked
            job["modules"]["_evolve_first_calls"] = _first_calls_source()
    return job


def first_calls_asked(problem: Problem) -> dict[str, Any] | None:
    """What the seed's job asks `_evolve_first_calls` for: the functions its fixed code calls (at most as many as a
    reply may carry) and its blocks' lines, since a call from the editable code itself is not the interface."""
    names = list(dict.fromkeys(interface_names(problem.seed_code)))[:FIRST_CALLS_CAP]
    if not names:
        return None
    code = problem.seed_code
    lines = [[code.count("\n", 0, b.start) + 1, code.count("\n", 0, b.end) + 1] for b in find_blocks(code)]
    return {"names": names, "block_lines": lines}


def native_section(problem: Problem, toolchain: Toolchain) -> dict[str, Any]:
    """The build and run commands with the limits of each part (the sandbox's own limits cover both)."""
    config, limits = problem.config, problem.config.limits
    assert config.run is not None
    section: dict[str, Any] = {
        "run": toolchain.argv(config.run.command),
        "timeout_s": limits.timeout_s,
        "memory_mb": limits.memory_mb,
        "max_file_mb": limits.max_file_mb,
    }
    if config.build is not None:
        section["build"] = {
            "command": toolchain.argv(config.build.command),
            "timeout_s": config.build.timeout_s,
            "memory_mb": config.build.memory_mb,
            "max_file_mb": config.build.max_file_mb,
        }
    return section


def interpret(problem: Problem, reply: Any, duration_s: float, sandbox: str) -> EvalOutcome:
    """Turn a harness reply into an outcome; a reply of the wrong shape is `bad_output`, never an exception."""
    why = malformed(reply, [c.name for c in problem.cases] if problem.form == "split" else None)
    if why is not None:
        return EvalOutcome.failure(problem, ErrorKind.BAD_OUTPUT, why, duration_s, sandbox)
    if "kind" in reply:
        outcome = EvalOutcome.failure(problem, ErrorKind(reply["kind"]), reply["error"], duration_s, sandbox)
    elif problem.form == "split":
        outcome = _score_split(problem, reply["outputs"], duration_s, sandbox)
    else:
        outcome = check_simple(problem, reply, duration_s, sandbox)
    if outcome.ok and not math.isfinite(scalar_view(problem.components, outcome.scores)):
        # Finite components whose weighted sum overflows (two of 1e308): an infinite best would stay best forever.
        shown = ", ".join(f"{k} {v:.6g}" for k, v in list(outcome.scores.items())[:4])
        outcome = EvalOutcome.failure(
            problem, ErrorKind.INVALID, f"the scores' scalar view is not finite ({shown})", duration_s, sandbox
        )
    outcome.build_s = build_seconds(reply.get("build_s"), duration_s)
    # What the candidate's code raised into the evaluator's, however the evaluator scored it (shape checked above).
    outcome.swallowed = most_frequent([SwallowedError.from_dict(entry) for entry in reply.get("swallowed") or []])
    outcome.first_calls = [c[:FIRST_CALL_CAP] for c in reply.get("first_calls") or []]  # kept for the seed alone
    return outcome


def build_seconds(value: Any, duration_s: float) -> float | None:
    """How long a native program's build took, as the harness measured it inside the sandbox: a number within
    the evaluation's own duration, else None (a Python program has none, and nothing else is believed)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0.0 <= value <= duration_s else None


def _score_split(problem: Problem, outputs: dict[str, Any], duration_s: float, sandbox: str) -> EvalOutcome:
    """Score each case the candidate answered with the trusted score(), all in one call (see Problem.score_outputs);
    a case whose score() failed itself (past its deadline, its process died) makes the outcome the evaluator's
    failure, kind `scorer`, whatever the other cases scored."""
    answered = [(case, outputs[case.name]["ok"]) for case in problem.cases if "ok" in outputs[case.name]]
    scored = dict(zip((case.name for case, _ in answered), problem.score_outputs(answered), strict=True))
    scores: dict[str, float] = {}
    case_errors: dict[str, str] = {}
    notes: list[str] = []
    scorer_errors: list[str] = []
    for case, spec in zip(problem.cases, problem.components, strict=True):
        result = scored.get(case.name)
        if result is None:  # the candidate failed this case: its own error, as the sandbox reported it
            scores[case.name], case_errors[case.name] = spec.failure, outputs[case.name]["error"]
            continue
        scores[case.name] = spec.failure if result.value is None else result.value
        if result.value is None:
            case_errors[case.name] = result.note or "score() failed"
        if result.note:
            notes.append(f"{case.name}: {result.note}")
        if result.scorer_error:
            scorer_errors.append(f"{result.scorer_error} on case {case.name}")
    feedback = "\n".join(notes[:20]) or None
    if scorer_errors:
        more = f" (and {len(scorer_errors) - 1} more cases)" if len(scorer_errors) > 1 else ""
        error = scorer_errors[0] + more
        outcome = EvalOutcome(
            scores, ErrorKind.SCORER, error, duration_s, sandbox, feedback=feedback, case_errors=case_errors
        )
        outcome.aborted = any(result.aborted for result in scored.values())  # Ctrl-C: nothing said of the child
        return outcome
    if case_errors and len(case_errors) == len(problem.cases):
        first = next(iter(case_errors.values()))
        kinds = {o.get("kind") for o in outputs.values()}
        kind = ErrorKind.TIMEOUT if kinds == {"timeout"} else ErrorKind.MEMORY if "memory" in kinds else None
        return EvalOutcome(
            scores,
            kind or ErrorKind.CRASH,
            f"every case failed; first: {first}"[:2000],
            duration_s,
            sandbox,
            feedback=feedback,
            case_errors=case_errors,
        )
    return EvalOutcome(scores, None, None, duration_s, sandbox, feedback=feedback, case_errors=case_errors)


def outcome_from(
    problem: Problem,
    reply: Any,
    status: str,
    stdout: str,
    stderr: str,
    duration_s: float,
    sandbox: str,
    *,
    oom_cap_mb: int | None = None,
) -> EvalOutcome:
    """What every backend returns: a `status` ("exit N", "signal X", "timeout", or "memory" when the process
    sandbox's job cgroup ran out) plus the reply.

    `oom_cap_mb` is given when a Docker memory cgroup of that size OOM-killed a process of the candidate. Either
    way the job scores `memory` whatever it answered: it got its answer by using more memory than allowed.
    """
    if status == "memory" or oom_cap_mb is not None:
        cap = problem.config.sandbox_limits.memory_mb if oom_cap_mb is None else oom_cap_mb
        outcome = EvalOutcome.failure(
            problem,
            ErrorKind.MEMORY,
            f"out of memory: together the job's processes went past its {cap} MiB memory cgroup",
            duration_s,
            sandbox,
        )
    elif status == "timeout":
        outcome = EvalOutcome.failure(
            problem, ErrorKind.TIMEOUT, f"exceeded {problem.config.sandbox_limits.timeout_s}s", duration_s, sandbox
        )
    elif reply is None:
        # A SIGKILL is no sign of memory by itself (a candidate may kill itself, and the hard CPU limit kills so):
        # a memory cgroup's OOM kill arrives as `status == "memory"` or `oom_cap_mb`, above.
        memory = "MemoryError" in stderr or "Cannot allocate memory" in stderr
        kind = ErrorKind.MEMORY if memory else ErrorKind.CRASH
        outcome = EvalOutcome.failure(
            problem, kind, f"no reply ({status}); stderr: {stderr[-400:]}", duration_s, sandbox
        )
    else:
        outcome = interpret(problem, reply, duration_s, sandbox)
    outcome.stdout, outcome.stderr = stdout, stderr
    return storable(outcome)


def storable(outcome: EvalOutcome) -> EvalOutcome:
    """The outcome with every text a sandbox or an evaluator put in it valid UTF-8: such text is stored in the
    archive and shown in prompts, and one lone surrogate made every commit fail (and an HTTP policy's request)."""
    text = storable_text
    outcome.error = None if outcome.error is None else text(outcome.error)
    outcome.feedback = None if outcome.feedback is None else text(outcome.feedback)
    outcome.stdout, outcome.stderr = text(outcome.stdout), text(outcome.stderr)
    outcome.case_errors = {text(k): text(v) for k, v in outcome.case_errors.items()}
    outcome.metrics = {text(k): v for k, v in outcome.metrics.items()}
    for stage in outcome.stages or ():
        stage["metrics"] = {text(k): v for k, v in stage.get("metrics", {}).items()}
    outcome.swallowed = [
        replace(
            e,
            type=text(e.type),
            message=text(e.message),
            file=None if e.file is None else text(e.file),
            code=None if e.code is None else text(e.code),
        )
        for e in outcome.swallowed
    ]
    outcome.swallowed = most_frequent(outcome.swallowed)  # a visible escape is longer than what it replaced
    outcome.first_calls = [text(c)[:FIRST_CALL_CAP] for c in outcome.first_calls]
    return outcome
