"""The project's rule that no source file grows past about 400 lines: a file that long holds more than one job and
is split by job (not squeezed). Checked over every tracked .py file, so a file that crosses the line fails here,
named with its length, in the change that made it cross."""

from __future__ import annotations

import subprocess
from pathlib import Path

MAX_LINES = 400
ROOT = Path(__file__).resolve().parents[1]


def tracked_python_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.py"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file()]


def test_no_tracked_python_file_is_over_400_lines():
    files = tracked_python_files()
    assert len(files) > 100  # the listing worked: the project's own files, not an empty or foreign tree
    lengths = {path.relative_to(ROOT).as_posix(): len(path.read_bytes().splitlines()) for path in files}
    too_long = {name: n for name, n in sorted(lengths.items()) if n > MAX_LINES}
    assert not too_long, f"over {MAX_LINES} lines, split each by job: {too_long}"
