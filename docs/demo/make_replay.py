"""Writes docs/demo/roman_replay.json: recorded-style completions for the README's report demo.

Each completion proposes three variants for problems/roman_numerals: partial symbol tables that grow stage
by stage (the last one is correct), written in a few styles, plus the failures real models produce (answers
without code, syntax errors, crashes, wrong output types). Usage: python docs/demo/make_replay.py
"""

from __future__ import annotations

import json
from pathlib import Path

TABLE = [
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
]
STAGES = [
    {"X", "V", "I", "L"},
    {"X", "V", "I", "L", "C"},
    {"X", "V", "I", "L", "C", "D", "M"},
    {"X", "V", "I", "L", "C", "D", "M", "IV", "IX"},
    {"X", "V", "I", "L", "C", "D", "M", "IV", "IX", "XL", "XC"},
    {s for _, s in TABLE},
]


def loop_style(pairs: list[tuple[int, str]]) -> str:
    return (
        'def solve(n):\n    out = ""\n    for value, letter in ' + repr(tuple(pairs)) + ":\n"
        "        while n >= value:\n            out += letter\n            n -= value\n    return out\n"
    )


def divmod_style(pairs: list[tuple[int, str]]) -> str:
    return (
        "def solve(n):\n    parts = []\n    for value, letter in " + repr(tuple(pairs)) + ":\n"
        '        count, n = divmod(n, value)\n        parts.append(letter * count)\n    return "".join(parts)\n'
    )


def fence(code: str) -> str:
    return f"```python\n{code}```\n"


def completion(*bodies: str) -> str:
    return "".join(f"<variant {k}>\n{body}</variant {k}>\n" for k, body in enumerate(bodies, 1))


def main() -> None:
    crash = fence("def solve(n):\n    return ROMAN[n]\n")
    wrong_type = fence("def solve(n):\n    return n\n")
    syntax = fence("def solve(n):\n    return 'I' * n +\n")
    out = []
    for i, stage in enumerate(STAGES):
        pairs = [p for p in TABLE if p[1] in stage]
        out.append(completion(fence(loop_style(pairs)), crash if i % 2 else syntax, fence(divmod_style(pairs[::-1]))))
        out.append(completion("I would add the missing symbols first.\n", fence(divmod_style(pairs)), wrong_type))
        out.append(completion(fence(loop_style(pairs[:-1])), fence(divmod_style(pairs[1:])), fence(loop_style(pairs))))
    Path(__file__).with_name("roman_replay.json").write_text(json.dumps(out, indent=1))
    print(f"wrote {len(out)} completions")


if __name__ == "__main__":
    main()
