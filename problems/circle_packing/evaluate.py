"""Circle packing, split form: the candidate only returns circles; validity is checked here, outside it."""

import math

TOL = 1e-9


def cases():
    return [{"name": f"n{n}", "input": n} for n in range(22, 27)]


def score(case, output):
    n = case["input"]
    if not isinstance(output, list) or len(output) != n:
        return 0.0, f"expected {n} circles"
    circles = []
    for c in output:
        if not isinstance(c, list | tuple) or len(c) != 3:
            return 0.0, "each circle must be (x, y, r)"
        x, y, r = (float(v) for v in c)
        if not all(math.isfinite(v) for v in (x, y, r)) or r < 0:
            return 0.0, "non-finite or negative value"
        if x - r < -TOL or x + r > 1 + TOL or y - r < -TOL or y + r > 1 + TOL:
            return 0.0, f"circle ({x:.3f}, {y:.3f}, {r:.3f}) leaves the square"
        circles.append((x, y, r))
    for i in range(n):
        for j in range(i + 1, n):
            (x1, y1, r1), (x2, y2, r2) = circles[i], circles[j]
            if math.hypot(x1 - x2, y1 - y2) < r1 + r2 - TOL:
                return 0.0, f"circles {i} and {j} overlap"
    return sum(c[2] for c in circles)
