import math


def cases():
    return [{"name": f"n{n}", "input": n} for n in (8, 10, 12, 14, 16)]


def score(case, output):
    n = case["input"]
    if not isinstance(output, list | tuple) or len(output) != n:
        return 0.0, f"expected a list of {n} points"
    pts = []
    for p in output:
        try:
            x, y = float(p[0]), float(p[1])
        except (TypeError, ValueError, IndexError):
            return 0.0, "each point must be an (x, y) pair of numbers"
        if not (math.isfinite(x) and math.isfinite(y)) or not (0 <= x <= 1 and 0 <= y <= 1):
            return 0.0, f"point ({x}, {y}) is outside the unit square"
        pts.append((x, y))
    d = min(math.dist(pts[i], pts[j]) for i in range(n) for j in range(i + 1, n))
    return d, f"min distance {d:.4f}"
