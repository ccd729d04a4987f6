"""0/1 knapsack, split form: the best values are computed here (dynamic programming) and never enter the sandbox."""

import random


def _instance(seed):
    rng = random.Random(seed)
    items = [[rng.randint(5, 60), rng.randint(3, 30)] for _ in range(18)]
    return {"capacity": sum(w for _, w in items) // 3, "items": items}


def _best(instance):
    best = [0] * (instance["capacity"] + 1)
    for value, weight in instance["items"]:
        for room in range(instance["capacity"], weight - 1, -1):
            best[room] = max(best[room], best[room - weight] + value)
    return best[-1]


def cases():
    out = []
    for k in range(6):
        instance = _instance(100 + k)
        out.append({"name": f"case_{k:03d}", "input": instance, "best": _best(instance)})
    return out


def score(case, output):
    items = case["input"]["items"]
    if not isinstance(output, list) or len(set(output)) != len(output):
        return 0.0, "return a list of distinct item indices"
    if not all(isinstance(i, int) and 0 <= i < len(items) for i in output):
        return 0.0, "an index is not an item"
    capacity, weight = case["input"]["capacity"], sum(items[i][1] for i in output)
    if weight > capacity:
        return 0.0, "over the capacity"
    value = sum(items[i][0] for i in output)
    return value / case["best"], (
        f"{len(output)} of {len(items)} items, weight {weight} of capacity {capacity} "
        f"({100 * weight // capacity}% full), value {value} of the best {case['best']}"
    )
