import math
import random


def _length(points, order):
    return sum(math.dist(points[order[i - 1]], points[order[i]]) for i in range(len(order)))


def _nearest_neighbour(points):
    left = set(range(1, len(points)))
    order = [0]
    while left:
        last = points[order[-1]]
        nxt = min(left, key=lambda j: math.dist(last, points[j]))
        left.remove(nxt)
        order.append(nxt)
    return order


def cases():
    out = []
    for i in range(6):
        rng = random.Random(500 + i)
        n = 60 + 12 * i
        pts = [(rng.random(), rng.random()) for _ in range(n)]
        out.append({"name": f"inst_{i:03d}", "input": pts, "reference": _length(pts, _nearest_neighbour(pts))})
    return out


def score(case, output):
    pts = case["input"]
    try:
        order = [int(v) for v in output]
    except (TypeError, ValueError):
        return 0.0, "tour() must return a list of city indices"
    if sorted(order) != list(range(len(pts))):
        return 0.0, "not a permutation of all cities"
    return case["reference"] / _length(pts, order)
