"""AdamW's state beside a saved adapter, so that training resumes where it stopped: with fresh moments a resumed
run's first updates take full-size steps again, as its very first did (issue 61: an arm cut off resumes with its
optimiser state). Only the newest version keeps the file (evolve/training.py removes the one before once the next
version is recorded): it is about twice the adapter's size."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

OPTIMIZER_FILE = "optimizer.pt"


def save_optimizer(optimizer: Any, directory: Path) -> None:
    import torch

    torch.save(optimizer.state_dict(), directory / OPTIMIZER_FILE)


def resume_optimizer(optimizer: Any, directory: Path, learning_rate: float, device: Any) -> bool:
    """Load the moments saved in `directory` into `optimizer`, its learning rate set to `learning_rate` (the
    resumed run's own); False, the optimizer left fresh, where there are none (a version saved before they were
    kept), the file cannot be read (cut short by a crash), or a moment's shape differs from its parameter's (another
    adapter: `load_state_dict` checks only how many parameters there are, and a moment of the wrong shape fails
    every later step)."""
    import torch

    path = directory / OPTIMIZER_FILE
    if not path.is_file():
        return False
    try:
        saved = torch.load(path, map_location=device, weights_only=True)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for index, param in enumerate(params):
            moments = saved["state"].get(index, {})
            if any(torch.is_tensor(m) and m.dim() and m.shape != param.shape for m in moments.values()):
                return False
        optimizer.load_state_dict(saved)
    except Exception:  # an unreadable file (empty, truncated, garbage): resume with fresh moments
        return False
    for group in optimizer.param_groups:
        group["lr"] = learning_rate
    return True


def drop_optimizer(directory: Path) -> None:
    """Remove a version's moments once a newer version holds the ones to resume from (a failure to remove leaves
    a stale file, never a lost version)."""
    with contextlib.suppress(OSError):
        (directory / OPTIMIZER_FILE).unlink(missing_ok=True)
