"""Interpreter layouts a new user makes: a virtual environment inside a checkout under /work, under /tmp, and
under a home folder. Each is a real `python -m venv --system-site-packages --without-pip`, removed afterwards.

Under /work: as root the test makes its own folder there (and /work itself when missing, removed after); an
unprivileged run gets one from scripts/test-as-user.sh through EVOLVE_LAYOUT_WORK_DIR.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = ["work", "tmp", "home"]


def _work_parent() -> Path | None:
    given = os.environ.get("EVOLVE_LAYOUT_WORK_DIR")
    if given:
        return Path(given)
    if os.geteuid() == 0:
        return Path("/work")
    return None


@contextlib.contextmanager
def checkout_folder(layout: str) -> Iterator[Path]:
    """A fresh folder standing for a checkout, in the layout's place; removed afterwards."""
    made_work = False
    if layout == "work":
        parent = _work_parent()
        if parent is None:
            pytest.skip("a folder under /work needs root, or EVOLVE_LAYOUT_WORK_DIR (scripts/test-as-user.sh)")
        made_work = parent == Path("/work") and not parent.exists()
        parent.mkdir(exist_ok=True)
    else:
        parent = Path(tempfile.gettempdir()) if layout == "tmp" else Path.home()
    folder = parent / f"evolve-layout-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if made_work:
            with contextlib.suppress(OSError):
                parent.rmdir()


@contextlib.contextmanager
def layout_venv(layout: str) -> Iterator[Path]:
    """The python of a virtual environment made in a checkout-like folder of the layout."""
    with checkout_folder(layout) as folder:
        venv = folder / ".venv"
        subprocess.run(
            [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
            check=True,
            timeout=180,
        )
        python = venv / "bin" / "python3"
        assert str(python).startswith({"work": str(folder), "tmp": "/tmp", "home": str(Path.home())}[layout])
        yield python


def env_for(python: Path, **extra: str) -> dict[str, str]:
    """The environment a subprocess of this checkout runs in, with `python`'s folder first on PATH."""
    return {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{python.parent}:{os.environ.get('PATH', '')}", **extra}
