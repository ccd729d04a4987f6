"""The run's code index: which normalised code the run already holds, what makes a variant a duplicate.

Part of the run's ledger (evolve/ledger.py), which alone changes it (tests/test_ledger_writers.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


class CodeIndex:
    """The run's normalised-code hashes, each with its program id (None while that child is queued or under
    evaluation): what makes a variant a duplicate. The sampler claims a hash when it parses a new child, the commit
    stage fills in the id once the program is stored, and a group that failed to store gives its claims back."""

    def __init__(self) -> None:
        self._ids: dict[str, int | None] = {}

    def __contains__(self, digest: object) -> bool:
        return digest in self._ids

    def program(self, digest: str) -> int | None:
        """The stored program with this code, if it is stored yet."""
        return self._ids.get(digest)

    def claim(self, digests: Iterable[str]) -> None:
        self._ids.update(dict.fromkeys(digests))

    def stored(self, digest: str, program_id: int) -> None:
        self._ids[digest] = program_id

    def forget(self, digests: Iterable[str]) -> None:
        for digest in digests:
            self._ids.pop(digest, None)

    def load(self, ids: Mapping[str, int]) -> None:
        """Start from what the archive holds (a resume)."""
        self._ids = dict(ids)
