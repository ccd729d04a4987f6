"""The archive's clock: naive UTC, as every timestamp column stores it.

Its own module so that the stages that stamp times (evaluation, groups) take the archive's notion of "now"
without importing the ORM tables.
"""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    """Now in UTC without a zone: the timestamp columns are naive, and comparing mixed kinds raises."""
    return datetime.now(UTC).replace(tzinfo=None)
