TESTS = [
    ("45", 45),
    ("45s", 45),
    ("2m", 120),
    ("10 min", 600),
    ("1h", 3600),
    ("1h30m", 5400),
    ("2h 30m", 9000),
    ("1h 2m 3s", 3723),
    ("90 seconds", 90),
    ("1.5 hours", 5400),
    ("3 days", 259200),
    ("1d 12h", 129600),
    ("2 weeks", 1209600),
    ("05:00", 300),
    ("1:05:30", 3930),
    ("1 hour and 15 minutes", 4500),
]


def cases():
    return [{"name": f"s_{i:03d}", "input": text, "expected": secs} for i, (text, secs) in enumerate(TESTS)]


def score(case, output):
    try:
        value = float(output)
    except (TypeError, ValueError):
        return 0.0, f"{case['input']!r}: returned {output!r}, not a number"
    ok = abs(value - case["expected"]) < 1e-6
    return (1.0 if ok else 0.0), f"{case['input']!r} -> {value:g}"
