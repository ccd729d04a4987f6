"""Seed: square the input (it does not yet)."""


# EVOLVE-BLOCK-START
def solve(x):
    return x + 1
# EVOLVE-BLOCK-END
