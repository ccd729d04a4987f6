"""What an offline experiment keeps between sittings on machines that do not outlive them: its small files
(measurements, split) and each finished training's adapter, packed, in a folder the user commits.

Why: on this CPU machine one training (about 2 hours on a core) and the measurement of its policy (about 45
minutes) rarely fit one 3-hour sitting beside other work, and the work folder and the adapters in it are gone with
the machine. A kept adapter is the trained policy itself, so the next sitting measures it without training again
(retraining on another CPU would not give the same weights). Only the adapter's config and weights are packed: the
optimizer's moments (twice the weights) serve a training that goes on, and a finished one does not.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
SMALL_FILES = ("state.json.xz", "split.json")


class KeptMismatch(Exception):
    """A kept adapter of another LoRA rank than the experiment's: measuring it would mix two experiments."""


class KeptWork:
    """A folder holding a work folder's small files and its finished trainings' adapters (`KEY.adapter.tar.xz`, or
    `KEY.adapter.none` for a training that had nothing to learn from)."""

    def __init__(self, folder: Path, work: Path) -> None:
        self.folder, self.work = folder, work
        folder.mkdir(parents=True, exist_ok=True)

    def restore(self) -> None:
        """Copy the kept small files into a work folder that lacks them (a new machine)."""
        for name in SMALL_FILES:
            if (self.folder / name).exists() and not (self.work / name).exists():
                shutil.copy(self.folder / name, self.work / name)

    def save(self) -> None:
        """Copy the work folder's small files in (after each checkpoint: they are kilobytes)."""
        for name in SMALL_FILES:
            if (self.work / name).exists():
                staging = self.folder / f"{name}.partial"
                shutil.copy(self.work / name, staging)
                staging.replace(self.folder / name)

    def has_adapter(self, key: str) -> bool:
        return (self.folder / f"{key}.adapter.tar.xz").exists() or (self.folder / f"{key}.adapter.none").exists()

    def adapter(self, key: str, rank: int) -> Path | None:
        """The kept adapter of training `key`, unpacked under the work folder; None where it learnt nothing. One of
        another LoRA rank than `rank` is refused (kept before the split recorded its rank)."""
        if (self.folder / f"{key}.adapter.none").exists():
            return None
        into = self.work / key / "kept-adapter"
        into.mkdir(parents=True, exist_ok=True)
        with tarfile.open(self.folder / f"{key}.adapter.tar.xz") as tar:
            tar.extractall(into, filter="data")  # names and modes checked: a plain file in `into`, nothing else
        kept_rank = json.loads((into / "adapter_config.json").read_text()).get("r")
        if kept_rank != rank:
            raise KeptMismatch(f"{self.folder}/{key}.adapter.tar.xz has LoRA rank {kept_rank}, not {rank}")
        return into

    def keep_adapter(self, key: str, adapter: Path | None) -> None:
        """Pack a finished training's adapter (or mark that it learnt nothing)."""
        if adapter is None:
            (self.folder / f"{key}.adapter.none").touch()
            return
        staging = self.folder / f"{key}.adapter.tar.xz.partial"
        with tarfile.open(staging, "w:xz") as tar:
            for name in ADAPTER_FILES:
                tar.add(adapter / name, arcname=name)
        staging.replace(self.folder / f"{key}.adapter.tar.xz")
