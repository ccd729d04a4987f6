"""The closed-loop study's SQLite archives, unpacked from the one file git keeps them in.

The archives (18 arms, their held-out archives, the probe and after-the-loop arms) are out of git as raw `.db`
files: `benchmarks/results/closed_loop/arms.tar.xz` holds them (see that folder's README.md). A tool that reads
them (flat_groups, copies, a reward replay) calls `study_folder()`: the study folder itself when the archives
are already unpacked there, else a cache folder the pack is unpacked into once (keyed by the pack's hash, so a
repacked study is unpacked afresh), laid out the same: `arms/`, `probe/`, `after_loop/`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tarfile
import tempfile
from pathlib import Path

STUDY = Path(__file__).resolve().parent / "results" / "closed_loop"
PACK = STUDY / "arms.tar.xz"


def _cache_root() -> Path:
    given = os.environ.get("EVOLVE_CACHE")
    return (Path(given).expanduser() if given else Path.home() / ".cache" / "vpo-evolve") / "closed_loop"


def study_folder() -> Path:
    """A folder holding the study's archives at their paths in the pack."""
    with tarfile.open(PACK) as pack:
        names = pack.getnames()
    if all((STUDY / name).is_file() for name in names):
        return STUDY
    digest = hashlib.sha256(PACK.read_bytes()).hexdigest()[:12]
    target = _cache_root() / digest
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Unpacked beside the target, then renamed: two tools unpacking at once never read a half-written archive.
    scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f"{digest}.unpacking-"))
    with tarfile.open(PACK) as pack:
        pack.extractall(scratch, filter="data")
    (scratch / ".complete").write_text("")
    with contextlib.suppress(OSError):  # another tool finished first: its copy is the same
        scratch.rename(target)
    return target
