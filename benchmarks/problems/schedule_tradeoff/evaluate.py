"""Two instances, each scored twice: the mean completion time of all jobs and that of the urgent (long) jobs, each
against its optimum alone (shortest processing time first, dealt to the machine free first: optimal for identical
machines; for the urgent jobs, the same over them alone, as if the short ones ran after)."""

import heapq
import random

URGENT = 40  # a job this long or longer is urgent


def _instance(seed, n, m):
    rng = random.Random(seed)
    # Many short jobs and a few long ones: the orders each objective wants are far apart.
    jobs = [rng.randint(1, 10) for _ in range(n - n // 8)] + [rng.randint(40, 90) for _ in range(n // 8)]
    rng.shuffle(jobs)
    return {"jobs": jobs, "machines": m}


def _optimal_flow(jobs, m):
    free = [0] * m
    total = 0
    for p in sorted(jobs):
        start = heapq.heappop(free)
        total += start + p
        heapq.heappush(free, start + p)
    return total / len(jobs)


def cases():
    out = []
    for tag, seed, n, m in (("a", 11, 40, 4), ("b", 23, 64, 6)):
        inst = _instance(seed, n, m)
        jobs = inst["jobs"]
        urgent = [p for p in jobs if p >= URGENT]
        out.append({"name": f"urgent_{tag}", "input": inst, "metric": "urgent", "reference": _optimal_flow(urgent, m)})
        out.append({"name": f"flow_{tag}", "input": inst, "metric": "flow", "reference": _optimal_flow(jobs, m)})
    return out


def score(case, output):
    jobs, m = case["input"]["jobs"], case["input"]["machines"]
    try:
        lanes = [[int(j) for j in lane] for lane in output]
    except (TypeError, ValueError):
        return 0.0, "schedule() must return lists of job indices"
    if len(lanes) != m:
        return 0.0, f"expected {m} machine lists, got {len(lanes)}"
    if sorted(j for lane in lanes for j in lane) != list(range(len(jobs))):
        return 0.0, "every job must appear exactly once"
    completions = []
    for lane in lanes:
        t = 0
        for j in lane:
            t += jobs[j]
            if case["metric"] == "flow" or jobs[j] >= URGENT:
                completions.append(t)
    mean = sum(completions) / len(completions)
    return case["reference"] / mean, f"mean completion ({case['metric']}) {mean:.2f}"
