# EVOLVE-BLOCK-START
def priority(item, now):
    """A number for one cached item: when the cache is full, the item with the lowest number is evicted.
    Only `item` and `now` are visible here. item = {"added": time it entered the cache, "last_use": time of its
    last request, "uses": requests so far}; now = the current time. The seed evicts the oldest entry first."""
    return item["added"]
# EVOLVE-BLOCK-END


def simulate(case):
    """Fixed: replay the trace through a cache of case["size"] items; for each request, the key evicted to make
    room for it (None on a hit or while the cache has room). The scorer replays these evictions itself."""
    table, evicted = {}, []
    for now, key in enumerate(case["trace"]):
        if key in table:
            table[key]["last_use"] = now
            table[key]["uses"] += 1
            evicted.append(None)
            continue
        victim = None
        if len(table) >= case["size"]:
            victim = min(table, key=lambda k: priority(dict(table[k]), now))
            del table[victim]
        evicted.append(victim)
        table[key] = {"added": now, "last_use": now, "uses": 1}
    return evicted
