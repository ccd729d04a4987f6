# EVOLVE-BLOCK-START
def solve(n):
    """Only knows I, V and X, and no subtractive forms yet."""
    out = ""
    for value, letter in ((10, "X"), (5, "V"), (1, "I")):
        while n >= value:
            out += letter
            n -= value
    return out


# EVOLVE-BLOCK-END
