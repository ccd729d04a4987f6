"""An OpenEvolve `config.yaml`, read where it maps onto this engine; every other setting gets one note.

OpenEvolve's settings fall into three groups here: those with a counterpart (mapped into the problem's
search, limits and evaluator sections), those whose job is done differently (ignored, with a note that
says how it is done here), and unknown keys (ignored, with a note). A file that is not valid YAML, or a
mapped value of the wrong type, is a `ProblemError`: one line naming the key and the fix.

The file comes with a problem folder, which is untrusted: it is read without YAML aliases (`*name`), which let
481 bytes expand to gigabytes (a billion-laughs file: 11.7 s and 657 MB for `evolve check`, one more line tens of
GB), at most `MAX_BYTES` long, and an error message shows a value through `shown`, which never builds more than a
few hundred characters of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from evolve.problem.errors import ProblemError, doc, shown
from evolve.problem.seed_files import read_text

MAX_BYTES = 1 << 20  # an OpenEvolve config is a few kB; a larger one is not a config

POLICY = "no meaning here: the policy is chosen with evolve run --policy"
ARCHIVE = "the archive (--db) keeps every program, prompt and evaluation as it lands"
SELECTION = "parents are chosen by lexicase, random scalarisations or tournament ([search] selection)"

# Settings with no counterpart: why each is ignored (keys are dotted paths; "llm.*" covers the section).
IGNORED: dict[str, str] = {
    "random_seed": "pass evolve run --seed",
    "checkpoint_interval": ARCHIVE + "; no checkpoints are needed to resume",
    "log_level": "progress is shown live; evolve inspect/report read the archive",
    "log_dir": "progress is shown live; evolve inspect/report read the archive",
    "max_code_length": "not enforced here",
    "early_stopping_patience": "stop with evolve run --target or --max-time",
    "convergence_threshold": "stop with evolve run --target or --max-time",
    "early_stopping_metric": "stop with evolve run --target (on the scalar view)",
    "evolution_trace": ARCHIVE,
    "max_tasks_per_child": "each evaluation runs in a fresh sandboxed process",
    "diff_pattern": "the parser accepts SEARCH/REPLACE blocks and fenced rewrites",
    "file_suffix": "programs are Python files",
    "llm.*": POLICY,
    "llm.top_p": "sampling uses top_p 0.95",
    "prompt.*": "prompts are built by evolve.prompts (parent, score vector, feedback, inspirations)",
    "database.*": ARCHIVE,
    "database.population_size": "no cap: " + ARCHIVE + "; each island's pool is its MAP-Elites grid",
    "database.archive_size": "no cap: " + ARCHIVE + "; each island's pool is its MAP-Elites grid",
    "database.feature_bins": "10 bins per score axis, log2 bins for code_length",
    "database.elite_selection_ratio": SELECTION,
    "database.exploration_ratio": SELECTION,
    "database.exploitation_ratio": SELECTION,
    "database.migration_rate": "migration moves [search] migration_size programs (default 2)",
    "database.diversity_metric": "no edit-distance diversity axis here",
    "evaluator.*": "not supported here",
    "evaluator.parallel_evaluations": "pass evolve run --workers",
    "evaluator.max_retries": "each program is evaluated once; a failure is stored with its error",
    "evaluator.use_llm_feedback": "no LLM judge here; the evaluator's numbers are the fitness",
    "evaluator.llm_feedback_weight": "no LLM judge here; the evaluator's numbers are the fitness",
    "evaluator.enable_artifacts": "artifacts always become feedback for the prompt",
    "evaluator.evaluator_args": "evaluate(program_path) is called with the path only",
}


@dataclass
class MappedConfig:
    """What `config.yaml` says in this engine's terms; `notes` are the ignored settings, one line each."""

    description: str | None = None
    search: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    evaluator: dict[str, Any] = field(default_factory=dict)
    stage_timeout_s: float | None = None
    feature_dimensions: list[str] | None = None
    notes: list[str] = field(default_factory=list)


class _AliasRefused(Exception):
    """A YAML alias was met (`line` is 1-based)."""

    def __init__(self, line: int) -> None:
        self.line = line


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases before they are expanded (no OpenEvolve config needs them)."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise _AliasRefused(self.peek_event().start_mark.line + 1)
        return super().compose_node(parent, index)


def _load_yaml(path: Path) -> Any:
    """The YAML document in `path`, read as `read_config` promises (no aliases, bounded size); ProblemError."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0  # read_text says why it cannot be read
    if size > MAX_BYTES:
        raise ProblemError(f"{path}: {size} bytes, more than any config ({MAX_BYTES} at most); fix config.yaml")
    text = read_text(path, "save config.yaml as UTF-8 text")
    try:
        return yaml.load(text, Loader=_NoAliasLoader)  # a safe loader, aliases refused
    except _AliasRefused as exc:
        raise ProblemError(
            f"{path}: a YAML alias (*name) at line {exc.line}; write the value out instead (aliases are not read: "
            "a few of them can expand a small file to gigabytes)"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ProblemError(f"{path}: not valid YAML{where} ({getattr(exc, 'problem', exc)}); fix the syntax") from None
    except RecursionError:
        raise ProblemError(f"{path}: not valid YAML (lists or mappings nested too deeply); fix the syntax") from None


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, what: str) -> ProblemError:
        return ProblemError(f"{self.path}: {key}: {what}; fix config.yaml (see {doc('openevolve.md')})")

    def number(self, key: str, value: Any, *, integer: bool, low: float) -> Any:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and (not integer or value == int(value))
        if not ok or value < low:
            kind = "an integer" if integer else "a number"
            raise self.fail(key, f"expected {kind} >= {low:g}, got {shown(value)}")
        return int(value) if integer else float(value)

    def flag(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {shown(value)}")
        return value

    def text(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"expected text, got {shown(value)}")
        return value

    def numbers(self, key: str, value: Any) -> list[float]:
        if not isinstance(value, list):
            raise self.fail(key, f"expected a list of numbers, got {shown(value)}")
        return [self.number(key, v, integer=False, low=float("-inf")) for v in value]

    def names(self, key: str, value: Any) -> list[str]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, f"expected a list of names, got {shown(value)}")
        return list(value)

    def section(self, key: str, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {type(value).__name__}")
        return value


def _note(out: MappedConfig, key: str) -> None:
    """One line for an ignored setting: its own reason, else its section's, else 'unknown setting'."""
    section_reason = IGNORED.get(f"{key.split('.')[0]}.*") if "." in key else None
    reason = IGNORED.get(key) or section_reason or "unknown setting"
    out.notes.append(f"config.yaml: {key} ignored: {reason}")


def read_config(path: Path) -> MappedConfig:
    """Map `path` (an OpenEvolve config.yaml) onto this engine; raises ProblemError when it is malformed."""
    r = _Reader(path)
    top = r.section("(top level)", _load_yaml(path))
    out = MappedConfig()
    for key, value in top.items():
        key = shown(key) if not isinstance(key, str) else key[:60]
        if key == "max_iterations":
            out.search["max_evaluations"] = r.number(key, value, integer=True, low=1)
        elif key == "diff_based_evolution":
            out.search["edit_format"] = "diff" if r.flag(key, value) else "full"
        elif key == "language":
            if value not in (None, "python"):
                raise r.fail(
                    key,
                    f"{shown(value)} programs are not run from an OpenEvolve folder; write a problem.toml with "
                    "[program] language, [build] and [run] (evolve init --language c|rust DIR writes one)",
                )
        elif key in ("llm", "prompt", "database", "evaluator"):
            _SECTIONS[key](r, r.section(key, value), out)
        else:
            _note(out, key)
    return out


def _llm(r: _Reader, section: dict[str, Any], out: MappedConfig) -> None:
    for key, value in section.items():
        where = f"llm.{key}"
        if key == "temperature" and value is not None:
            out.search["temperature"] = r.number(where, value, integer=False, low=1e-6)
        elif key == "max_tokens" and value is not None:
            out.search["max_new_tokens"] = r.number(where, value, integer=True, low=16)
        elif key == "system_message" and value is not None:
            out.description = out.description or r.text(where, value)
        else:
            _note(out, where)


def _prompt(r: _Reader, section: dict[str, Any], out: MappedConfig) -> None:
    shown = {"num_top_programs": 3, "num_diverse_programs": 2}  # OpenEvolve's defaults
    inspirations = False
    for key, value in section.items():
        where = f"prompt.{key}"
        if key == "system_message":
            out.description = r.text(where, value)
        elif key in shown:
            shown[key] = r.number(where, value, integer=True, low=0)
            inspirations = True
        else:
            _note(out, where)
    if inspirations:
        out.search["inspirations"] = sum(shown.values())


def _database(r: _Reader, section: dict[str, Any], out: MappedConfig) -> None:
    for key, value in section.items():
        where = f"database.{key}"
        if key == "num_islands":
            out.search["islands"] = r.number(where, value, integer=True, low=1)
        elif key == "migration_interval":
            out.search["migration_interval"] = r.number(where, value, integer=True, low=1)
        elif key == "feature_dimensions":
            out.feature_dimensions = r.names(where, value)
        else:
            _note(out, where)


def _evaluator(r: _Reader, section: dict[str, Any], out: MappedConfig) -> None:
    for key, value in section.items():
        where = f"evaluator.{key}"
        if key == "timeout":
            out.stage_timeout_s = r.number(where, value, integer=False, low=0.001)
        elif key == "memory_limit_mb" and value is not None:
            out.limits["memory_mb"] = r.number(where, value, integer=True, low=64)
        elif key == "cascade_evaluation":
            out.evaluator["cascade"] = r.flag(where, value)
        elif key == "cascade_thresholds":
            out.evaluator["cascade_thresholds"] = r.numbers(where, value)
        else:
            _note(out, where)


_SECTIONS = {"llm": _llm, "prompt": _prompt, "database": _database, "evaluator": _evaluator}
