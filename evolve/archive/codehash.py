"""Normalised code hashes: programs that differ only in comments, docstrings, layout or local names are the same
program.

Normalising is a parse, docstrings set aside (`docstrings.py`: kept where the program may read them), a
canonical renaming of function-local variables (`local_names.py`) and an unparse,
the dearest thing the engine does per variant; models repeat themselves (the parent's code verbatim, the same
answer in two completions), so the hash of text already seen comes from a bounded memo keyed by a digest of the
raw text, and only new text is parsed.

A program is hashed file by file only where its problem is one of several files (`multi_file`, a value the caller
takes from `Problem.multi_file`: the archive reads no problem config), never because its text starts with a
`=== FILE: ` line. On a problem of one file such a text is one file, of whatever language: normalising a `calc.py`
part of a shell program as Python took `x=1` and `x = 1` (an assignment, and a command that fails) for one program,
and the second was never evaluated. The hash of such a text changed with this (it was rare, and made only by that
bug), so HASH_VERSION stays: a stored one-file program that reads as a tree keeps its old hash, and a new copy of
it is evaluated once more rather than taken for a duplicate.
"""

from __future__ import annotations

import ast
import hashlib
import threading

from evolve.archive.docstrings import strip_docstrings
from evolve.archive.local_names import canonicalize
from evolve.filetree import HEADER_PREFIX, tree_files

MEMO_SIZE = 1 << 15  # raw-text digests remembered (about 5 MB); the oldest is forgotten first
# The memo's key tells the two layouts apart: one text may be hashed as one file and as several (two runs of one
# process, or a test), and the two hashes differ.
_LAYOUTS = {False: b"one file", True: b"several files"}

# Every hash names the normalisation that made it, so that a run stored under an earlier one is recognised and
# brought up to date on resume (`upgrade_code_hashes`) instead of missing its duplicates. Version 1 (layout and
# comments) wrote bare sha256 hex; "v" is no hex digit, so no version-1 hash starts with a later prefix.
# 2: local names too; 3: a program of several files hashed file by file, .py only parsed; 4: docstrings set aside;
# 5: strings set aside only where the text compiles and spells none of `docstrings.SUSPECT_SUBSTRINGS`
HASH_VERSION = "v5"


def normalize(code: str, multi_file: bool = False) -> str:
    """`normalize_one` of the one text, or, on a problem of several files (`multi_file`), of each .py file of the
    program (any other file is data or another language: kept as written, since Python's rules would merge
    `{"a": 1}` and `{'a': 1}`). Each file is headed by its path and its normalised length: a docstring's escaped
    newlines come out of `ast.unparse` as real ones, and could otherwise spell the next file's header."""
    files = tree_files(code) if multi_file else None
    if files is None:
        return normalize_one(code)
    out = []
    for path, text in files:
        body = normalize_one(text) if path.endswith(".py") else text
        out.append(f"{HEADER_PREFIX}{path} === {len(body)}\n{body}\n")
    return "".join(out)


def normalize_one(code: str) -> str:
    """Python code as `ast.unparse` writes it without docstrings and with canonical local names; other text
    without blank lines and trailing blanks; Python too deep or too large to walk (which CPython may still run)
    exactly as written.

    Other text keeps its comments, so a copy of the parent that differs only in one looks new there (the parser
    drops the lead comment a held answer opens each fenced block with, `// Change: ...`, before it comes here).
    Only text that does not parse loses its blank lines: in a program that parses, a blank line can sit inside a
    string literal, and two programs merged by such a loss would be one evaluation short. How deep the parser can
    go depends on the caller's stack, so a deep program may be hashed as written on one thread and normalised on
    another: a duplicate missed, never a false one."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        lines = (line.rstrip() for line in code.replace("\r\n", "\n").split("\n"))
        return "\n".join(line for line in lines if line)
    except (RecursionError, MemoryError):
        return code
    try:
        strip_docstrings(tree, code)
        canonicalize(tree)
        return ast.unparse(tree)
    except (RecursionError, MemoryError):
        return code


def normalized_hash(code: str, multi_file: bool = False) -> str:
    """The hash of the normalised code, parsed every time: what the memo must always agree with. 64 characters,
    the version prefix and 248 bits of sha256. `multi_file`: see `normalize`."""
    normal = normalize(code, multi_file)
    digest = hashlib.sha256(normal.encode(errors="surrogatepass")).hexdigest()  # model text may hold one
    return HASH_VERSION + digest[: 64 - len(HASH_VERSION)]


def is_current(digest: str) -> bool:
    """Whether a stored hash was made by this normalisation (False for one of an earlier version)."""
    return digest.startswith(HASH_VERSION)


class CodeHasher:
    """`normalized_hash` with a bounded memo of the raw texts already seen; safe to share between threads (the
    loop hashes on its thread, the committer on another)."""

    def __init__(self, memo_size: int = MEMO_SIZE) -> None:
        self.memo_size = memo_size
        self._memo: dict[bytes, str] = {}
        self._lock = threading.Lock()

    @property
    def remembered(self) -> int:
        """How many raw texts the memo holds now (at most `memo_size`)."""
        return len(self._memo)

    def hash(self, code: str, multi_file: bool = False) -> str:
        """`normalized_hash(code, multi_file)`, from the memo when this text was hashed so before."""
        key = hashlib.blake2b(code.encode(errors="surrogatepass"), digest_size=16, person=_LAYOUTS[multi_file])
        raw = key.digest()
        with self._lock:
            known = self._memo.get(raw)
        if known is not None:
            return known
        digest = normalized_hash(code, multi_file)
        with self._lock:
            if len(self._memo) >= self.memo_size:
                del self._memo[next(iter(self._memo))]
            self._memo[raw] = digest
        return digest


code_hash = CodeHasher().hash  # the process's one memo: every caller of the archive shares what was parsed
