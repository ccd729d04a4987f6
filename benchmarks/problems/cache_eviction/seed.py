# EVOLVE-BLOCK-START
def priority(item, now):
    """A number for one cached item: when the cache is full, the item with the lowest number is evicted.
    Only `item` and `now` are visible here. item = {"added": time it entered the cache, "last_use": time of its
    last request, "uses": requests so far}; now = the current time. The seed evicts the oldest entry first."""
    return item["added"]
# EVOLVE-BLOCK-END


def simulate(case):
    """Fixed: replay the trace through a cache of case["size"] items; the list of hits (True/False) per request."""
    table, hits = {}, []
    for now, key in enumerate(case["trace"]):
        if key in table:
            table[key]["last_use"] = now
            table[key]["uses"] += 1
            hits.append(True)
            continue
        hits.append(False)
        if len(table) >= case["size"]:
            del table[min(table, key=lambda k: priority(dict(table[k]), now))]
        table[key] = {"added": now, "last_use": now, "uses": 1}
    return hits
