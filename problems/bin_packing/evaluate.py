"""Online bin packing, split form: instances are generated here; feasibility is checked outside the sandbox."""

import math
import random


def _instance(family, seed, n=400, capacity=150):
    rng = random.Random(seed)
    if family == "uniform":
        items = [rng.randint(20, 100) for _ in range(n)]
    else:
        items = [min(capacity, max(1, int(rng.weibullvariate(45, 3.0)))) for _ in range(n)]
    return {"capacity": capacity, "items": items}


def cases():
    out = []
    for i in range(8):
        family = "uniform" if i < 4 else "weibull"
        out.append({"name": f"inst_{i:03d}", "input": _instance(family, 1000 + i)})
    return out


def score(case, output):
    inst = case["input"]
    items, capacity = inst["items"], inst["capacity"]
    if not isinstance(output, list) or len(output) != len(items):
        return 0.0, "assignment must list one bin per item"
    load = {}
    for item, b in zip(items, output, strict=False):
        if not isinstance(b, int) or b < 0:
            return 0.0, "bin indices must be non-negative ints"
        load[b] = load.get(b, 0) + item
    if any(v > capacity for v in load.values()):
        return 0.0, "a bin is over capacity"
    lower_bound = math.ceil(sum(items) / capacity)
    return lower_bound / len(load)
