import math

SHIFT = 0.7
NAMES = ["sphere", "rosenbrock", "rastrigin", "ackley", "styblinski"]


def _objective(name, x):
    z = [v - SHIFT for v in x]
    if name == "sphere":
        return sum(v * v for v in z)
    if name == "rosenbrock":
        z = [v + 1 for v in z]
        return sum(100 * (z[i + 1] - z[i] ** 2) ** 2 + (1 - z[i]) ** 2 for i in range(len(z) - 1))
    if name == "rastrigin":
        return 10 * len(z) + sum(v * v - 10 * math.cos(2 * math.pi * v) for v in z)
    if name == "ackley":
        n = len(z)
        a = -20 * math.exp(-0.2 * math.sqrt(sum(v * v for v in z) / n))
        return a - math.exp(sum(math.cos(2 * math.pi * v) for v in z) / n) + 20 + math.e
    z = [v - 2.903534 for v in z]
    return sum(v**4 - 16 * v * v + 5 * v for v in z) / 2 + 39.16617 * len(z)


def cases():
    return [{"name": n, "input": {"function": n, "dim": 5, "budget": 2000}} for n in NAMES]


def score(case, output):
    spec = case["input"]
    try:
        x = [float(v) for v in output["x"]]
        calls = int(output["calls"])
    except (TypeError, KeyError, ValueError):
        return 0.0, "minimize() must return a list of floats"
    if len(x) != spec["dim"] or not all(math.isfinite(v) and -5 <= v <= 5 for v in x):
        return 0.0, f"x must hold {spec['dim']} finite floats in [-5, 5]"
    if calls > spec["budget"]:
        return 0.0, f"{calls} calls to f, over the budget of {spec['budget']}"
    value = max(_objective(spec["function"], x), 0.0)
    return 1.0 / (1.0 + value), f"f(x) = {value:.4g}"
