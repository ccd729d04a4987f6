"""The shape of a harness reply, checked before anything of it is believed.

Whatever runs in the sandbox can write the reply: a candidate shares its process with the harness (it may patch
`json.dumps`, write the reply pipe itself, or in the simple form return what the evaluator passes on). So every
field is checked for the type our harness writes (sandboxes/harness.py, simple_results.py, native_run.py); one
of another type (a list where text is due, a number too large for a float, NaN as a kind, a missing key) makes
the child `bad_output`. Scoring a malformed reply raised in the trusted scorer once (`{"kind": [...]}` is
unhashable), an engine failure that five such children turned into a stopped run.

Stdlib only, and the problem model only for its `ErrorKind`.
"""

from __future__ import annotations

from typing import Any

from evolve.problem.outcome import FIRST_CALLS_CAP, SWALLOWED_CAP, ErrorKind

# What a sandbox may say went wrong; `scorer` is the engine's own verdict on the evaluator, never the sandbox's.
SANDBOX_KINDS = frozenset(kind.value for kind in ErrorKind) - {"scorer"}
SIMPLE_KEYS = ("scores", "feedback", "incomplete", "stages")
SWALLOWED_KEYS = frozenset({"type", "message", "file", "line", "code", "count"})


def malformed(reply: Any, case_names: list[str] | None) -> str | None:
    """Why `reply` is not a reply our harness writes, in one line; None when its shape is right.

    `case_names` are the split form's cases (None: the simple form). The values a candidate answers for a case
    (`{"ok": value}`) are its own business: any JSON value may be an answer, and score() judges it."""
    if not isinstance(reply, dict):
        return "the sandbox sent no valid reply"
    build = reply.get("build_s")
    if build is not None and not _number(build):
        return f"the reply's build_s is {_kind(build)}, not a number"
    if (why := _swallowed(reply.get("swallowed"))) is not None:
        return why
    calls = reply.get("first_calls")
    if calls is not None and not (
        isinstance(calls, list) and len(calls) <= FIRST_CALLS_CAP and all(isinstance(c, str) for c in calls)
    ):
        return f"the reply's first calls are not a list of at most {FIRST_CALLS_CAP} texts"
    if "kind" in reply:
        return _failure(reply, "the reply")
    if case_names is None:
        return _simple(reply)
    outputs = reply.get("outputs")
    if not isinstance(outputs, dict):
        return "reply has no outputs"
    if set(outputs) != set(case_names):
        missing = [n for n in case_names if n not in outputs][:3]
        unknown = [n[:40] for n in outputs if n not in set(case_names)][:3]
        return f"the reply's outputs name other cases than the job's (missing {missing}, unknown {unknown})"
    for name, got in outputs.items():
        where = f"case {name!r}"
        if not isinstance(got, dict):
            return f"{where} is {_kind(got)}, not an object"
        if ("ok" in got) == ("kind" in got):
            return f"{where} has {'both' if 'ok' in got else 'neither'} 'ok' {'and' if 'ok' in got else 'nor'} 'kind'"
        if "kind" in got and (why := _failure(got, where)) is not None:
            return why
    return None


def _failure(part: dict[str, Any], where: str) -> str | None:
    """A failure as the harness reports one: {"kind": one of SANDBOX_KINDS, "error": text}."""
    kind, error = part.get("kind"), part.get("error")
    if not isinstance(kind, str):
        return f"{where}'s kind is {_kind(kind)}, not text"
    if kind not in SANDBOX_KINDS:
        return f"{where}'s kind {kind[:40]!r} is none of {', '.join(sorted(SANDBOX_KINDS))}"
    if not isinstance(error, str):
        return f"{where}'s error is {_kind(error)}, not text"
    return None


def _simple(reply: dict[str, Any]) -> str | None:
    """A simple-form reply: {"scores": {name: number}, "feedback": text or null, "incomplete": text or null,
    "stages": [{"stage": n, "metrics": {name: number}}] (a cascade only)}."""
    scores = reply.get("scores")
    if not isinstance(scores, dict):
        return "evaluate() returned no scores" if scores is None else f"the reply's scores are {_kind(scores)}"
    wrong = [name for name, value in scores.items() if not _number(value)]
    if wrong:
        return f"the reply's score {wrong[0][:40]!r} is {_kind(scores[wrong[0]])}, not a number"
    for key in ("feedback", "incomplete"):
        if reply.get(key) is not None and not isinstance(reply[key], str):
            return f"the reply's {key} is {_kind(reply[key])}, not text"
    stages = reply.get("stages", [])
    if not isinstance(stages, list):
        return f"the reply's stages are {_kind(stages)}, not a list"
    for stage in stages:
        shaped = isinstance(stage, dict) and _integer(stage.get("stage")) and isinstance(stage.get("metrics"), dict)
        if not shaped:
            return "the reply has a stage that is not {stage: n, metrics: {name: number}}"
        if not all(_number(value) and _fits_float(value) for value in stage["metrics"].values()):
            return f"stage {stage['stage']}'s metrics are not all numbers a float can hold"
    return None


def _swallowed(entries: Any) -> str | None:
    """What the candidate's code raised into the evaluator's (absent when nothing did): at most SWALLOWED_CAP
    entries {type: text, message: text, file: text or null, line: n >= 0 or null, code: text or null, count: n >= 1}."""
    if entries is None:
        return None
    if not isinstance(entries, list):
        return f"the reply's swallowed errors are {_kind(entries)}, not a list"
    if len(entries) > SWALLOWED_CAP:
        return f"the reply names {len(entries)} swallowed errors, more than the {SWALLOWED_CAP} a harness sends"
    for entry in entries:
        if not isinstance(entry, dict) or set(entry) != SWALLOWED_KEYS:
            return "the reply has a swallowed error that is not {type, message, file, line, code, count}"
        texts = isinstance(entry["type"], str) and isinstance(entry["message"], str)
        file, line, count = entry["file"], entry["line"], entry["count"]
        if not texts or not all(v is None or isinstance(v, str) for v in (file, entry["code"])):
            return "the reply has a swallowed error whose type, message, file or code is not text"
        if not (line is None or (_integer(line) and 0 <= line < 2**31)) or not (_integer(count) and 1 <= count < 2**53):
            return "the reply has a swallowed error whose line or count is not a whole number in range"
    return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fits_float(value: int | float) -> bool:
    try:
        float(value)
    except OverflowError:
        return False
    return True


def _kind(value: Any) -> str:
    """What a value is, for a message: "a list", "null", "NaN"."""
    if value is None:
        return "null"
    if isinstance(value, float) and value != value:
        return "NaN"
    name = {"str": "text", "dict": "an object", "list": "a list", "bool": "a boolean"}.get(type(value).__name__)
    return name or f"a {type(value).__name__}"
