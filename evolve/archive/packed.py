"""Token ids and logprobs as the archive packs them: little-endian int32 / float32 arrays, not JSON.

A long run stores millions of them and the trainer reads them back in bulk; this module is the one place
that knows the packing, for the writer (`inserts.py`) and for readers of stored completions alike.
"""

from __future__ import annotations

from array import array
from typing import Any


def pack_ints(values: list[int] | None) -> bytes | None:
    return None if values is None else array("i", values).tobytes()


def pack_floats(values: list[float] | None) -> bytes | None:
    return None if values is None else array("f", values).tobytes()


def unpack(data: bytes | None, code: str) -> list[Any] | None:
    """The values packed in `data` with array type `code` ("i" ids, "f" logprobs); None stays None."""
    if data is None:
        return None
    out = array(code)
    out.frombytes(data)
    return out.tolist()
