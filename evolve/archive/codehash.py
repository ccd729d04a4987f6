"""Normalised code hashes: programs that differ only in comments or layout are the same program."""

from __future__ import annotations

import ast
import hashlib


def normalize(code: str) -> str:
    try:
        return ast.unparse(ast.parse(code))
    except (SyntaxError, ValueError, RecursionError):
        lines = (line.rstrip() for line in code.replace("\r\n", "\n").split("\n"))
        return "\n".join(line for line in lines if line)


def code_hash(code: str) -> str:
    return hashlib.sha256(normalize(code).encode()).hexdigest()
