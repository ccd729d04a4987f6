import math
import random

SHIFT = 0.7


def objective(name, x):
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


# EVOLVE-BLOCK-START
def minimize(f, dim, budget):
    """The best point found (a list of `dim` floats in [-5, 5]), calling f at most `budget` times.
    Pure random search."""
    rng = random.Random(0)
    best, best_x = float("inf"), None
    for _ in range(budget):
        x = [rng.uniform(-5, 5) for _ in range(dim)]
        y = f(x)
        if y < best:
            best, best_x = y, x
    return best_x
# EVOLVE-BLOCK-END


def solve(case):
    calls = [0]

    def f(x):
        calls[0] += 1
        return objective(case["function"], x)

    x = minimize(f, case["dim"], case["budget"])
    return {"x": [float(v) for v in x], "calls": calls[0]}
