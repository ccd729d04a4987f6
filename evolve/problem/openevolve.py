"""OpenEvolve problem folders (`initial_program.py` + `evaluator.py`, maybe `config.yaml`) run as they are.

There is no problem.toml to name the fitness components, so the seed is evaluated once (every cascade
stage, whatever its score) and each number it returns becomes a component to maximise. `combined_score`,
when present, is the scalar view (weight 1, the others 0): the search optimises what the author meant,
while the other metrics still drive lexicase and the MAP-Elites axes. `problem_toml` writes the inferred
problem out for users who want to edit it (`evolve init --from DIR`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from evolve.problem.blocks import BlockError, find_blocks
from evolve.problem.config import ComponentSpec, ProblemConfig, plain_name
from evolve.problem.loader import Problem, ProblemError, _top_level_functions
from evolve.problem.openevolve_config import MappedConfig, read_config, shown
from evolve.problem.seed_files import FIXED_NAMES, check_fixed_names, read_text

if TYPE_CHECKING:
    from evolve.problem.outcome import EvalOutcome

PROGRAM, EVALUATOR, CONFIG = "initial_program.py", "evaluator.py", "config.yaml"
COMBINED = "combined_score"
STAGE_TIMEOUT_S = 300.0  # OpenEvolve's default, per stage
MEMORY_MB = 4096  # OpenEvolve sets no limit; its evaluators often load numpy/scipy
FEATURES = {"complexity": "code_length", "score": "score"}


def is_openevolve_folder(folder: str | Path) -> bool:
    root = Path(folder)
    return (
        root.is_dir()
        and not (root / "problem.toml").exists()
        and (root / PROGRAM).is_file()
        and (root / EVALUATOR).is_file()
    )


def _name(root: Path) -> str:
    return plain_name(root.name.lower(), "openevolve")


def _stage_count(functions: set[str], cascade: bool) -> int:
    return sum(f"evaluate_stage{i}" in functions for i in (1, 2, 3)) if cascade else 0


def _config(root: Path, mapped: MappedConfig, components: list[ComponentSpec], features: list[str]) -> ProblemConfig:
    functions = _top_level_functions(root / EVALUATOR)
    evaluator = {"file": EVALUATOR, "form": "simple", "names": "lenient", **mapped.evaluator}
    stages = _stage_count(functions, evaluator.get("cascade", True))
    if "evaluate" not in functions and not stages:
        raise ProblemError(
            f"{root / EVALUATOR}: no evaluate(program_path) (nor evaluate_stage1 with cascade_evaluation on); "
            "define evaluate(program_path) returning a dict of metrics"
        )
    per_stage = mapped.stage_timeout_s or STAGE_TIMEOUT_S
    raw: dict[str, Any] = {
        "name": _name(root),
        "description": mapped.description or _default_description(components),
        "program": {"file": PROGRAM},
        "evaluator": evaluator,
        "fitness": {"components": [c.model_dump() for c in components]},
        "limits": {"timeout_s": per_stage * max(stages, 1), "memory_mb": MEMORY_MB, **mapped.limits},
        "search": {**mapped.search, **({"features": features} if features else {})},
    }
    try:
        return ProblemConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ProblemError(f"{root}: {where}: {err['msg']}; fix {CONFIG} or write problem.toml") from None


def _default_description(components: list[ComponentSpec]) -> str:
    names = ", ".join(c.name for c in components) or "its metrics"
    overall = f" {COMBINED} is the overall score." if any(c.name == COMBINED for c in components) else ""
    return f"Improve the program. {EVALUATOR} scores it on {names}; larger is better for each.{overall}"


def _problem(root: Path, mapped: MappedConfig, components: list[ComponentSpec], features: list[str]) -> Problem:
    seed_path = root / PROGRAM
    seed_code = read_text(seed_path)
    try:
        find_blocks(seed_code)
    except BlockError as exc:
        raise ProblemError(f"{seed_path}: {exc}; balance the EVOLVE-BLOCK markers") from None
    config = _config(root, mapped, components, features)
    return Problem(root, config, seed_code, "simple", tuple(config.fitness.components), root / EVALUATOR)


def infer_components(metrics: dict[str, float]) -> list[ComponentSpec]:
    """One maximised component per number; combined_score alone weighs in the scalar view when present.

    A failure scores 0, or twice the seed's value when that is negative, so it never beats the seed.
    """
    combined = COMBINED in metrics
    out = []
    for name, value in metrics.items():
        weight = 1.0 if not combined or name == COMBINED else 0.0
        fail = 0.0 if not value < 0 else 2.0 * value
        out.append(ComponentSpec(name=name, weight=weight, fail_value=fail))
    return out


def _features(mapped: MappedConfig, names: set[str]) -> list[str]:
    out: list[str] = []
    for dim in mapped.feature_dimensions or []:
        feature = FEATURES.get(dim, dim if dim in names else None)
        if feature is None:
            why = "no diversity axis here" if dim == "diversity" else "not a metric the seed returned"
            mapped.notes.append(f"config.yaml: database.feature_dimensions {shown(dim)} dropped: {why}")
        elif feature not in out:
            out.append(feature)
    return out


def load_openevolve(folder: str | Path, evaluate: Callable[[Problem], EvalOutcome]) -> tuple[Problem, list[str]]:
    """The folder as a problem, with its components inferred from one evaluation of the seed.

    `evaluate` scores a problem's seed in a sandbox. Returns the problem and the notes on config.yaml
    settings that were ignored (one line each, for the caller to show once).
    """
    root = Path(folder).resolve()
    check_fixed_names(root, (PROGRAM, EVALUATOR, CONFIG, *FIXED_NAMES))  # none a link out of the folder
    config_path = root / CONFIG
    mapped = read_config(config_path) if config_path.is_file() else MappedConfig()
    # Profiled with no components (a placeholder satisfies the schema): every number comes back as a metric.
    profile = _problem(root, mapped, [ComponentSpec(name="profile", fail_value=0.0)], [])
    profile.components = ()
    # Every stage runs when profiling the seed, so later stages' metrics are known too.
    thresholds = [float("-inf")] * 3
    profile.config = profile.config.model_copy(
        update={"evaluator": profile.config.evaluator.model_copy(update={"cascade_thresholds": thresholds})}
    )
    outcome = evaluate(profile)
    if not outcome.ok:
        raise ProblemError(
            f"{root / PROGRAM}: the seed scored {outcome.error_kind}: {(outcome.error or '')[:300]}; the metrics "
            f"are read from the seed's evaluation, so fix the seed or {EVALUATOR}"
        )
    if not outcome.metrics:
        said = f" (it said: {outcome.feedback[:200]})" if outcome.feedback else ""
        raise ProblemError(
            f"{root / EVALUATOR}: the seed's evaluation returned no numeric metrics{said}; "
            'return a dict such as {"combined_score": 0.5}'
        )
    bad = [n for n in outcome.metrics if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", n)]
    if bad:
        raise ProblemError(
            f"{root / EVALUATOR}: metric name {shown(bad[0])} cannot name a component; use letters, digits, _ . -"
        )
    components = infer_components(outcome.metrics)
    features = _features(mapped, set(outcome.metrics))
    return _problem(root, mapped, components, features), mapped.notes


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {float("inf"): "inf", float("-inf"): "-inf"}.get(value, repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items() if v is not None) + " }"
    raise TypeError(f"no TOML for {type(value).__name__}")


def problem_toml(problem: Problem) -> str:
    """The problem as a problem.toml that `load_problem` reads back to the same config."""
    data = problem.config.model_dump(mode="python")
    desc = data.pop("description")
    literal = "'''" not in desc and "\r" not in desc and not desc.endswith("'")
    lines = [
        "# Inferred from an OpenEvolve folder by `evolve init --from`; edit freely (see docs/problem-format.md).",
        f"name = {_toml_value(data.pop('name'))}",
        f"description = '''\n{desc}'''" if literal else f"description = {_toml_value(desc)}",
    ]
    for section, body in data.items():
        if body is None:  # [build] and [run]: an OpenEvolve folder's program is Python, imported
            continue
        lines.append(f"\n[{section}]")
        for key, value in body.items():
            if value is None or (section == "fitness" and key != "components"):
                continue
            if section == "fitness":
                lines.append("components = [")
                lines += [f"  {_toml_value({k: v for k, v in c.items()})}," for c in value]
                lines.append("]")
            else:
                lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
