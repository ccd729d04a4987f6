"""One rule for tests that need an outside part (Docker, PostgreSQL, Ray, Chromium): where it is missing they
skip on a developer's machine, and fail when EVOLVE_REQUIRE_SERVICES=1 (set by .ci/run), so a green CI means
every such test really ran."""

from __future__ import annotations

import os

import pytest


def services_required() -> bool:
    return os.environ.get("EVOLVE_REQUIRE_SERVICES") == "1"


def missing(part: str, reason: str) -> None:
    """Skip, or fail under EVOLVE_REQUIRE_SERVICES=1, because `part` cannot be used for `reason`."""
    message = f"{part} unavailable: {reason}"
    if services_required():
        pytest.fail(f"{message} (EVOLVE_REQUIRE_SERVICES=1: .ci/run must install and start it)", pytrace=False)
    pytest.skip(f"{message} (start it, or run .ci/run)")
