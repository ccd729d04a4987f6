"""One rule for tests that need an outside part (Docker, PostgreSQL, Ray, Chromium): where it is missing they
skip on a developer's machine, and fail when EVOLVE_REQUIRE_SERVICES=1 (set by .ci/run), so a green CI means
every such test really ran."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import NoReturn

import pytest


def services_required() -> bool:
    return os.environ.get("EVOLVE_REQUIRE_SERVICES") == "1"


def broken_not_missing(part: str, reason: str) -> bool:
    """bubblewrap is installed, and its jail fails for a reason other than the kernel's user namespaces: then
    sandboxes/jail.py itself is broken (one bad mount once stopped every job), which must fail on every machine
    rather than turn every sandbox attack test into a skip and the run green."""
    return part == "bubblewrap" and shutil.which("bwrap") is not None and "user namespaces" not in reason


def missing(part: str, reason: str) -> None:
    """Skip, or fail under EVOLVE_REQUIRE_SERVICES=1, because `part` cannot be used for `reason`."""
    message = f"{part} unavailable: {reason}"
    if broken_not_missing(part, reason):
        pytest.fail(f"{part} is installed but fails: {reason}", pytrace=False)
    if services_required():
        pytest.fail(f"{message} (EVOLVE_REQUIRE_SERVICES=1: .ci/run must install and start it)", pytrace=False)
    pytest.skip(f"{message} (start it, or run .ci/run)")


USER_PASS = Path(__file__).resolve().parents[1] / "scripts" / "test-as-user.sh"


def left_to_the_unprivileged_pass(reason: str) -> NoReturn:
    """Skip, as root, a test that root cannot run here by design, because scripts/test-as-user.sh (run by .ci/run
    after the root pass) runs it unprivileged. Fails instead where that script does not run the test's file, or
    where this is no root: such a skip would hide a test that no pass runs."""
    current = os.environ.get("PYTEST_CURRENT_TEST", "").partition("::")[0]
    listed = re.findall(r"tests/[\w/]+\.py", USER_PASS.read_text())
    if os.geteuid() != 0:
        pytest.fail(f"{reason}: only root may leave a test to the unprivileged pass", pytrace=False)
    if current not in listed:
        pytest.fail(f"{reason}, and {USER_PASS.name} does not run {current or 'this test'}: add it", pytrace=False)
    pytest.skip(f"{reason}; scripts/test-as-user.sh runs this unprivileged")
