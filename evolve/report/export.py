"""What `evolve best --out` and `evolve export` write: a program's files as its problem lays them out, and the
CSV of every evaluation with its times, policy version and parse status.

Why the layout comes from the run and never from the text: a program of one file is whatever text the model
wrote, and a text that happens to start with a `=== FILE: ` line is still that one file (on a shell problem
it even runs and scores). So the files written follow the problem config stored with the run
(`config["problem"]["program"]`): a program of one file becomes one file named as the problem's seed file; a
program of several files is split (evolve.filetree) and written only at paths its `[program] files` allow.
Where the files land, and how they are written, is evolve.report.outdir's.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolve.archive.report_reads import ExportRow
from evolve.filetree import TreeError, check_layout, split_files
from evolve.report.outdir import OutputError, check_output_path

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


@dataclass(frozen=True)
class ProgramLayout:
    """How a run's programs are laid out as files: `seed_name` for a program of one file, `entries` (the
    problem's `[program] files`, empty for one file) for a program of several."""

    seed_name: str = "seed.py"
    entries: tuple[str, ...] = ()

    @classmethod
    def of_run(cls, config: Mapping[str, Any]) -> ProgramLayout:
        """The layout stored with a run; seed.py for a run from before problem configs were stored. TreeError,
        one line, when the stored config is not one a problem could have."""
        problem = config.get("problem") or {}
        program = (problem.get("program") or {}) if isinstance(problem, Mapping) else None
        if not isinstance(program, Mapping):
            raise TreeError("the run's stored problem config is not a table; the archive is damaged")
        name = Path(str(program.get("file") or "seed.py")).name
        try:
            check_output_path(name)
        except OutputError as exc:
            raise TreeError(f"the run's stored [program] file: {exc}") from None
        entries = program.get("files") or ()
        if not isinstance(entries, list | tuple) or not all(isinstance(e, str) and e for e in entries):
            raise TreeError("the run's stored [program] files is not a list of paths; the archive is damaged")
        return cls(name, tuple(entries))

    @property
    def suffix(self) -> str:
        """The seed file's suffix (.py, .c, .rs): what `export` names each program of one file with."""
        return Path(self.seed_name).suffix or ".txt"

    def files(self, code: str) -> list[tuple[str, str]]:
        """(path, text) of each file of the program `code`, as `best --out` writes them; TreeError, one line,
        when a program of several files breaks the tree rules or names a path its layout does not allow."""
        if not self.entries:
            return [(self.seed_name, code)]
        files = split_files(code)
        check_layout([path for path, _ in files], self.entries)
        return files

    def exported(self, stem: str, code: str) -> list[tuple[str, str]]:
        """The same under `export`'s name for it: `stem` plus the suffix, or a folder `stem` holding its tree."""
        if not self.entries:
            return [(stem + self.suffix, code)]
        return [(f"{stem}/{path}", text) for path, text in self.files(code)]


def evaluation_lines(rows: Sequence[ExportRow]) -> Iterator[str]:
    """The CSV of `rows`, line by line (so that a large run is written as it is made). Times are UTC ISO 8601.
    parse_status is `seed` for a program no answer produced (the seed)."""
    names: list[str] = []
    for row in rows:
        names += [n for n in row.scores if n not in names]
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    for values in _csv_rows(rows, names):
        writer.writerow(values)
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()


def _csv_rows(rows: Iterable[ExportRow], names: list[str]) -> Iterator[list[object]]:
    yield [*FIXED, *names]
    for r in rows:
        yield [
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
