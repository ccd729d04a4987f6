"""Simple-form results inside the sandbox: what `evaluate()` (or a cascade of stages) returns, as a reply.

Stdlib only. The engine ships this source with each simple-form job and the harness installs it as the
module `_evolve_simple`, so the process and Docker sandboxes need no extra files. Numbers are scores;
strings, lists, dicts and artifacts become feedback; the cascade follows OpenEvolve's `evaluate_stage1/2/3`.
"""

import json
import traceback


def _number(value):
    """The value as a float when it is a number (numpy scalars included), else None: then it is feedback."""
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, str | bytes) or hasattr(value, "__len__") or not hasattr(value, "__float__"):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _text(value):
    """A note as prompt text: strings as they are, anything else as JSON (or its str when not JSON-able)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    if hasattr(value, "tolist"):
        value = value.tolist()
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def split_result(result):
    """(numbers, notes, problem) from evaluate()'s return: a dict, (dict, feedback), or .metrics/.artifacts.

    Numbers are scores; everything else (strings, lists, artifacts) is kept as notes for the prompt.
    """
    notes = {}
    if isinstance(result, tuple) and len(result) == 2:
        result, text = result
        if text is not None:
            notes["feedback"] = text
    metrics = getattr(result, "metrics", result)
    artifacts = getattr(result, "artifacts", None)
    if not isinstance(metrics, dict):
        return None, None, f"evaluate() returned {type(metrics).__name__}, not a dict"
    numbers = {}
    for key, value in metrics.items():
        number = _number(value)
        if number is None:
            notes[str(key)] = value
        else:
            numbers[str(key)] = number
    if isinstance(artifacts, dict):
        notes.update({str(k): v for k, v in artifacts.items()})
    elif artifacts:
        notes["artifacts"] = artifacts
    return numbers, notes, None


def _gate_score(metrics):
    """What a cascade threshold is compared with: combined_score, else the mean of the other numbers."""
    if "combined_score" in metrics:
        return metrics["combined_score"]
    values = [v for k, v in metrics.items() if k != "error"]
    return sum(values) / len(values) if values else None


def run_cascade(evaluator, program, thresholds):
    """evaluate_stage1, then each later stage only while the merged metrics reach its threshold.

    `thresholds` None runs every stage (how the seed is profiled); a stage with no threshold never runs.
    Returns (merged numbers, notes, stages, incomplete reason or None); a stage-1 exception propagates.
    """
    merged, notes, stages, incomplete = {}, {}, [], None
    for index in range(3):
        stage = getattr(evaluator, f"evaluate_stage{index + 1}", None)
        if stage is None:
            break
        if index and thresholds is not None:
            score = _gate_score(merged)
            limit = thresholds[index - 1] if index - 1 < len(thresholds) else None
            if limit is None or score is None or score < limit:
                shown = "none" if score is None else f"{score:.6g}"
                incomplete = f"cascade stopped after stage {index}: score {shown} below threshold {limit}"
                break
        try:
            numbers, extra, bad = split_result(stage(program))
        except Exception as exc:
            if not index:
                raise
            incomplete = f"stage {index + 1} raised " + traceback.format_exception_only(type(exc), exc)[-1].strip()
            break
        if bad:
            if not index:
                return None, None, stages, bad
            incomplete = f"stage {index + 1}: {bad}"
            break
        stages.append({"stage": index + 1, "metrics": numbers})
        merged.update(numbers)
        notes.update(extra)
    return merged, notes, stages, incomplete


def render_notes(notes):
    """Notes as text for the prompt: a lone feedback string as it is, else one `key: value` line each."""
    if set(notes) == {"feedback"} and isinstance(notes["feedback"], str):
        return notes["feedback"]
    return "\n".join(f"{key}: {_text(value)[:4000]}" for key, value in notes.items()) or None


def evaluate(evaluator, job):
    """The reply for one simple-form job; exceptions propagate to the harness, which reports a failure."""
    cascade = job.get("cascade")
    if cascade is not None and hasattr(evaluator, "evaluate_stage1"):
        numbers, notes, stages, incomplete = run_cascade(evaluator, job["program"], cascade["thresholds"])
        if numbers is None:
            return {"kind": "bad_output", "error": incomplete}
    else:
        numbers, notes, bad = split_result(evaluator.evaluate(job["program"]))
        if bad:
            return {"kind": "bad_output", "error": bad}
        stages, incomplete = [], None
    if incomplete:
        notes["evaluation"] = incomplete
    error = notes.get("error")
    if incomplete is None and error not in (None, "") and not isinstance(error, int | float):
        incomplete = "the evaluator reported an error"
    reply = {"scores": numbers, "feedback": render_notes(notes), "incomplete": incomplete}
    if stages:
        reply["stages"] = stages
    return reply
