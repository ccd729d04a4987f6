"""The report's reads from the archive, as arrays: each view's columns come from `archive.report_reads` (the SQL
lives in the archive) and are turned here into what the aggregation computes on.

Telemetry the archive does not hold yet is derived: tokens from the packed `token_ids` blob length (4 bytes a
token), evaluation start from its commit time minus its duration. Columns may be absent or NULL in older
archives; every reader here tolerates that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from evolve.archive import Archive
from evolve.archive.report_reads import ExportRow, VersionRow
from evolve.filetree import TreeError, program_diff
from evolve.problem.outcome import swallowed_lines
from evolve.report.export import ProgramLayout

TEXT_LIMIT = 20_000  # per text field of a program's detail: enough to read, bounded for the report's size


def times(values: list[str | None]) -> np.ndarray:
    """Timestamps as the archive gives them in bulk (text), parsed by numpy; None becomes NaT."""
    return np.array([v or "NaT" for v in values], dtype="datetime64[us]")


@dataclass(frozen=True)
class EvaluationColumns:
    """Every evaluation of a run in commit order, column-wise; scores as an (N, D) matrix, NaN where absent."""

    program_id: np.ndarray
    island: np.ndarray
    scalar: np.ndarray  # NaN for failed evaluations
    error_kind: list[str | None]
    evaluated_at: np.ndarray  # datetime64[us]
    code_length: np.ndarray
    scores: np.ndarray


def score_matrix(vectors: list[dict[str, Any]], names: list[str]) -> np.ndarray:
    """(N, D) floats, NaN where a component is missing. Vectors whose keys are exactly `names` in order (what
    evaluators return) are taken whole; only the others are looked up name by name."""
    order = tuple(names)
    nan = float("nan")
    rows = [list(v.values()) if tuple(v) == order else [v.get(n, nan) for n in names] for v in vectors]
    return np.array(rows, dtype=float).reshape(len(vectors), len(names))


def evaluation_columns(archive: Archive, run_id: int, names: list[str]) -> EvaluationColumns:
    """One query; the score vectors are decoded by one json.loads over all rows (a per-row decoder costs
    several times more at 100k rows)."""
    table = archive.report_reads.evaluation_table(run_id)
    failed = [kind is not None or scalar is None for kind, scalar in zip(table.error_kind, table.scalar, strict=True)]
    vectors = json.loads("[" + ",".join(v or "{}" for v in table.scores_json) + "]")
    matrix = score_matrix(vectors, names)
    matrix[np.array(failed, dtype=bool)] = np.nan
    return EvaluationColumns(
        program_id=np.array(table.program_id, dtype=np.int64),
        island=np.array(table.island, dtype=np.int64),
        scalar=np.array([np.nan if f else v for v, f in zip(table.scalar, failed, strict=True)], dtype=float),
        error_kind=table.error_kind,
        evaluated_at=times(table.evaluated_at),
        code_length=np.array(table.code_length, dtype=np.int64),
        scores=matrix,
    )


def variant_rows(archive: Archive, run_id: int) -> tuple[list[str], np.ndarray]:
    """Parse status and completion time of every answer of every completion of the run."""
    rows = archive.report_reads.variant_times(run_id)
    return rows.status, times(rows.completed_at)


def valid_child_times(archive: Archive, run_id: int) -> np.ndarray:
    """Completion times of the answers that made a new child which evaluated without error."""
    return times(archive.report_reads.valid_child_times(run_id))


def version_rows(archive: Archive, run_id: int) -> list[VersionRow]:
    """Each policy version with its update statistics and the best scalar among the children it wrote."""
    return archive.report_reads.version_rows(run_id)


def change_key(archive: Archive, run_id: int) -> tuple[Any, ...]:
    """Cheap fingerprint of what the views read: it changes whenever the run commits something."""
    return archive.report_reads.change_key(run_id)


def _clip(text: str | None) -> str | None:
    if text is None or len(text) <= TEXT_LIMIT:
        return text
    return text[:TEXT_LIMIT] + f"\n... [{len(text) - TEXT_LIMIT} more characters in the archive]"


def several_files(archive: Archive, run_id: int) -> bool:
    """Whether the run's problem is one of several files (its stored `[program] files`), which decides whether a
    program's diff goes file by file; never the program's text. A stored config the layout cannot read counts
    as one file: its programs are then shown as the one text each is."""
    run = archive.find_run(run_id)
    try:
        return run is not None and bool(ProgramLayout.of_run(run.config).entries)
    except TreeError:
        return False


def program_detail(archive: Archive, program_id: int) -> dict[str, Any] | None:
    """What a lineage node opens: code, diff against the parent, scores, feedback, errors, prompt, completion."""
    detail = archive.report_reads.program_detail(program_id)
    if detail is None:
        return None
    program, ev, origin = detail.program, detail.program.evaluation, detail.origin
    diff = None
    if detail.parent_code is not None:
        several = several_files(archive, program.run_id)
        labels = f"program {program.parent_id}", f"program {program.id}"
        diff = "\n".join(program_diff(detail.parent_code, program.code, *labels, several))
    return {
        "id": program.id,
        "parent_id": program.parent_id,
        "island": program.island,
        "generation": program.generation,
        "created_at": program.created_at.isoformat(),
        "code": _clip(program.code),
        "diff": _clip(diff),
        "scores": ev.scores if ev else None,
        "scalar": ev.scalar if ev else None,
        "error_kind": ev.error_kind if ev else None,
        "error": _clip(ev.error) if ev else None,
        "feedback": _clip(ev.feedback) if ev else None,
        "swallowed": swallowed_lines(ev.swallowed) if ev else [],  # what its code raised into the evaluator
        "stdout": _clip(ev.stdout) if ev else None,
        "stderr": _clip(ev.stderr) if ev else None,
        "duration_s": ev.duration_s if ev else None,
        "slot": origin.slot if origin else None,
        "parse_status": origin.parse_status if origin else None,
        "completion": _clip(origin.completion) if origin else None,
        "prompt": _clip(origin.prompt) if origin else None,
        "policy_version": origin.policy_version if origin else None,
    }


def export_rows(archive: Archive, run_id: int) -> list[ExportRow]:
    """One row per evaluation with its times and the policy version and parse status of the answer that made it."""
    return archive.report_reads.export_rows(run_id)
