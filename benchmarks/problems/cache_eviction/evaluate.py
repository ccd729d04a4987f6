"""Three request traces through a cache of 40 items, each favouring another eviction rule: `shifting` moves its
working set every phase (recency wins: evict the least recently used), `hot_and_scan` interleaves a small hot set with
keys seen once (frequency wins: evict the least used), `loop` cycles over a few more keys than the
cache holds (evicting the most recent keeps most of the loop). Each component is your hits over the hits of
Belady's optimal offline policy on that trace, in [0, 1]."""

import random

SIZE = 40


def _shifting(rng):
    trace = []
    for phase in range(8):
        keys = [phase * 25 + k for k in range(55)]  # consecutive phases share part of their keys
        trace += [keys[min(int(rng.expovariate(1 / 14)), 54)] for _ in range(250)]
    return trace


def _hot_and_scan(rng):
    trace, fresh = [], 10_000
    for _ in range(12):
        hot = [rng.randrange(30) for _ in range(90)]
        scan = list(range(fresh, fresh + 60))  # keys never seen again, interleaved with the hot ones
        fresh += 60
        while hot or scan:
            take_scan = scan and (not hot or rng.random() < 0.4)
            trace.append((scan if take_scan else hot).pop(0))
    return trace


def _loop(rng):
    trace = []
    for _ in range(30):
        trace += list(range(52))
        if rng.random() < 0.5:
            trace.append(rng.randrange(52))
    return trace


TRACES = {"shifting": _shifting, "hot_and_scan": _hot_and_scan, "loop": _loop}


def _optimal_hits(trace, size):
    """Belady: on a miss with a full cache, evict the key whose next request is furthest away."""
    next_use, last_seen = [0] * len(trace), {}
    for t in range(len(trace) - 1, -1, -1):
        next_use[t] = last_seen.get(trace[t], len(trace))
        last_seen[trace[t]] = t
    cache, hits = {}, 0
    for t, key in enumerate(trace):
        if key in cache:
            hits += 1
        elif len(cache) >= size:
            del cache[max(cache, key=cache.get)]
        cache[key] = next_use[t]
    return hits


def cases():
    out = []
    for i, (name, make) in enumerate(TRACES.items()):
        trace = make(random.Random(100 + i))
        out.append({"name": name, "input": {"trace": trace, "size": SIZE}, "reference": _optimal_hits(trace, SIZE)})
    return out


def score(case, output):
    """Replays the trace with the candidate's evictions (its own count of hits is never trusted): a miss with a full
    cache must evict a key the cache holds."""
    trace, size = case["input"]["trace"], case["input"]["size"]
    if not isinstance(output, list) or len(output) != len(trace):
        return 0.0, "simulate() must return one entry per request (the evicted key, or None)"
    cache, hits = set(), 0
    for t, key in enumerate(trace):
        if key in cache:
            hits += 1
            continue
        if len(cache) >= size:
            victim = output[t]
            try:
                held = victim in cache
            except TypeError:  # an unhashable answer
                held = False
            if not held:
                return 0.0, f"request {t}: the evicted key {victim!r} is not in the cache"
            cache.discard(victim)
        cache.add(key)
    return hits / case["reference"], f"{hits} hits of {len(trace)} requests (optimal {case['reference']})"
