"""Normalised code hashes: programs that differ only in comments or layout are the same program.

Normalising is a parse and an unparse, the dearest thing the engine does per variant; models repeat
themselves (the parent's code verbatim, the same answer in two completions), so the hash of text already seen
comes from a bounded memo keyed by a digest of the raw text, and only new text is parsed.
"""

from __future__ import annotations

import ast
import hashlib
import threading

MEMO_SIZE = 1 << 15  # raw-text digests remembered (about 5 MB); the oldest is forgotten first
_memo: dict[bytes, str] = {}
_memo_lock = threading.Lock()  # the loop hashes on its thread, the committer's fallback on another


def normalize(code: str) -> str:
    try:
        return ast.unparse(ast.parse(code))
    except (SyntaxError, ValueError, RecursionError):
        lines = (line.rstrip() for line in code.replace("\r\n", "\n").split("\n"))
        return "\n".join(line for line in lines if line)


def _normalized_hash(code: str) -> str:
    return hashlib.sha256(normalize(code).encode()).hexdigest()


def code_hash(code: str) -> str:
    raw = hashlib.blake2b(code.encode(errors="surrogatepass"), digest_size=16).digest()
    with _memo_lock:
        known = _memo.get(raw)
    if known is not None:
        return known
    digest = _normalized_hash(code)
    with _memo_lock:
        if len(_memo) >= MEMO_SIZE:
            del _memo[next(iter(_memo))]
        _memo[raw] = digest
    return digest
