"""Greedy packing: try the items in the order lib.ranking gives, keep each that still fits."""

from lib import params
from lib.ranking import order


def solve(instance):
    """Take the items in the order `order(items)` gives; keep each that still fits within
    capacity * params.fill_fraction(). Returns the chosen indices, sorted."""
    items = instance["items"]
    room = instance["capacity"] * params.fill_fraction()
    chosen, used = [], 0
    for i in order(items):
        weight = items[i][1]
        if used + weight <= room:
            chosen.append(i)
            used += weight
    return sorted(chosen)
