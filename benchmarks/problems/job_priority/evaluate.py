"""One machine, one job list, three objectives whose optimal orders differ: shortest processing time first
minimises the mean completion time of all jobs, the urgent jobs first (shortest among them first) minimises theirs,
earliest due date first minimises the maximum tardiness. Each component is the optimum of its objective alone
over yours, in (0, 1]; a priority that blends the rules lands between them."""

import random

N_JOBS = 40


def _jobs():
    rng = random.Random(7)
    jobs = []
    for i in range(N_JOBS):
        urgent = i % 5 == 0  # 8 urgent jobs, long ones: the orders the objectives want are far apart
        time = rng.randint(20, 45) if urgent else rng.randint(1, 15)
        jobs.append({"time": time, "urgent": urgent, "due": 0})
    total = sum(j["time"] for j in jobs)
    for j in jobs:  # due dates tight enough that even the best order is late somewhere
        j["due"] = rng.randint(total // 10, total * 7 // 10)
    rng.shuffle(jobs)
    return jobs


def _completions(jobs, order):
    t, done = 0, {}
    for i in order:
        t += jobs[i]["time"]
        done[i] = t
    return done


def _objective(metric, jobs, order):
    done = _completions(jobs, order)
    if metric == "flow":
        return sum(done.values()) / len(jobs)
    if metric == "urgent":
        urgent = [done[i] for i in range(len(jobs)) if jobs[i]["urgent"]]
        return sum(urgent) / len(urgent)
    return max(max(done[i] - jobs[i]["due"], 0) for i in range(len(jobs)))


_RULES = {
    "flow": lambda j: j["time"],
    "urgent": lambda j: (not j["urgent"], j["time"]),
    "tardiness": lambda j: j["due"],
}


def cases():
    jobs = _jobs()
    out = []
    for metric, rule in _RULES.items():
        best = _objective(metric, jobs, sorted(range(len(jobs)), key=lambda i: rule(jobs[i])))
        out.append({"name": metric, "input": jobs, "metric": metric, "reference": best})
    return out


def score(case, output):
    jobs = case["input"]
    try:
        order = [int(i) for i in output]
    except (TypeError, ValueError):
        return 0.0, "priority() must return a number (or a tuple of numbers) for every job"
    if sorted(order) != list(range(len(jobs))):
        return 0.0, "the order must hold every job exactly once"
    value = _objective(case["metric"], jobs, order)
    label = {"flow": "mean completion time", "urgent": "mean completion time of urgent jobs"}
    return case["reference"] / value, f"{label.get(case['metric'], 'maximum tardiness')} {value:.1f}"
