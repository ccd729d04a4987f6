# EVOLVE-BLOCK-START
def priority(item):
    """When the cache is full, the item with the lowest priority is evicted.
    item = {"added": time it entered the cache, "last_use": time of its last request, "uses": requests so far}.
    The seed evicts the oldest entry first."""
    return item["added"]
# EVOLVE-BLOCK-END


def simulate(case):
    """Fixed: replay the trace through a cache of case["size"] items; the list of hits (True/False) per request."""
    cache, hits = {}, []
    for now, key in enumerate(case["trace"]):
        if key in cache:
            cache[key]["last_use"] = now
            cache[key]["uses"] += 1
            hits.append(True)
            continue
        hits.append(False)
        if len(cache) >= case["size"]:
            victim = min(cache, key=lambda k: priority(dict(cache[k])))
            del cache[victim]
        cache[key] = {"added": now, "last_use": now, "uses": 1}
    return hits
