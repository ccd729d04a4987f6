"""AdamW's state beside a saved adapter, so that training resumes where it stopped: with fresh moments a resumed
run's first updates take full-size steps again, as its very first did (issue 61: an arm cut off resumes with its
optimiser state). Only the newest version keeps the file (evolve/training.py removes the one before once the next
version is recorded): it is about twice the adapter's size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

OPTIMIZER_FILE = "optimizer.pt"


def save_optimizer(optimizer: Any, directory: Path) -> None:
    import torch

    torch.save(optimizer.state_dict(), directory / OPTIMIZER_FILE)


def resume_optimizer(optimizer: Any, directory: Path, learning_rate: float, device: Any) -> bool:
    """Load the moments saved in `directory` into `optimizer`, its learning rate set to `learning_rate` (the
    resumed run's own); False where there are none (a version saved before they were kept) or they do not fit
    this adapter (another rank or target modules), and the optimizer is left fresh."""
    import torch

    path = directory / OPTIMIZER_FILE
    if not path.is_file():
        return False
    try:
        optimizer.load_state_dict(torch.load(path, map_location=device, weights_only=True))
    except (ValueError, KeyError, RuntimeError):
        return False
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    return True
