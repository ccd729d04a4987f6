# EVOLVE-BLOCK-START
def solve(n):
    """Points along the diagonal: valid, but crowded."""
    step = 1.0 / (n - 1)
    return [(i * step, i * step) for i in range(n)]
# EVOLVE-BLOCK-END
