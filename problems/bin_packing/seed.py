# EVOLVE-BLOCK-START
def priority(item, remaining):
    """One score per open bin the item fits in (`remaining[k]` is bin k's free room); the item goes to the bin
    with the highest score. First fit: prefer the earliest open bin."""
    return [-i for i in range(len(remaining))]


# EVOLVE-BLOCK-END


def solve(instance):
    """Pack the items online; returns the bin index of every item."""
    capacity, bins, assignment = instance["capacity"], [], []
    for item in instance["items"]:
        fits = [i for i, free in enumerate(bins) if free >= item]
        if fits:
            scores = priority(item, [bins[i] for i in fits])
            best = fits[max(range(len(fits)), key=lambda k: scores[k])]
        else:
            bins.append(capacity)
            best = len(bins) - 1
        bins[best] -= item
        assignment.append(best)
    return assignment
