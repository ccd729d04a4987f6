import math


# EVOLVE-BLOCK-START
def solve(n):
    """Place n equal circles on the smallest square grid that holds them."""
    k = math.ceil(math.sqrt(n))
    r = 0.5 / k
    circles = []
    for i in range(n):
        row, col = divmod(i, k)
        circles.append((r + 2 * r * col, r + 2 * r * row, r))
    return circles


# EVOLVE-BLOCK-END
