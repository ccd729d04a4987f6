"""The order in which the packer tries the items."""


# EVOLVE-BLOCK-START
def order(items):
    """Indices of `items` ([value, weight] pairs), the most promising first."""
    return sorted(range(len(items)), key=lambda i: -items[i][0])


# EVOLVE-BLOCK-END
