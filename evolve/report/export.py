"""The CSV of `evolve export`: every evaluation with its times, policy version and parse status."""

from __future__ import annotations

import csv
from pathlib import Path

from evolve.archive.report_reads import ExportRow

FIXED = [
    "program_id",
    "parent_id",
    "island",
    "generation",
    "created_at",
    "evaluated_at",
    "duration_s",
    "policy_version",
    "parse_status",
    "error_kind",
    "scalar",
]


def write_evaluations_csv(path: Path, rows: list[ExportRow]) -> None:
    """Times are UTC ISO 8601. parse_status is `seed` for a program no answer produced (the seed)."""
    names: list[str] = []
    for row in rows:
        names += [n for n in row.scores if n not in names]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*FIXED, *names])
        for r in rows:
            writer.writerow(
                [
                    r.program_id,
                    r.parent_id,
                    r.island,
                    r.generation,
                    r.created_at.isoformat(),
                    r.evaluated_at.isoformat(),
                    f"{r.duration_s:.4f}",
                    "" if r.policy_version is None else r.policy_version,
                    r.parse_status or ("seed" if r.parent_id is None else ""),
                    r.error_kind or "",
                    r.scalar,
                    *(r.scores.get(n) for n in names),
                ]
            )
