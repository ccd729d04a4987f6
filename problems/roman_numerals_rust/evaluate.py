"""Roman numerals, split form: expected answers are computed here and never enter the sandbox."""

INPUTS = [
    1,
    3,
    4,
    8,
    9,
    14,
    19,
    27,
    40,
    44,
    49,
    90,
    94,
    99,
    400,
    444,
    500,
    900,
    999,
    1066,
    1987,
    2024,
    3549,
    3999,
]
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


def _roman(n):
    out = []
    for value, letters in TABLE:
        count, n = divmod(n, value)
        out.append(letters * count)
    return "".join(out)


def cases():
    return [{"name": f"t_{i:03d}", "input": n, "expected": _roman(n)} for i, n in enumerate(INPUTS)]


def score(case, output):
    if not isinstance(output, str):
        return 0.0, f"{case['input']}: returned {type(output).__name__}, not str"
    if output == case["expected"]:
        return 1.0
    return 0.0, f"{case['input']}: got {output[:40]!r}"
