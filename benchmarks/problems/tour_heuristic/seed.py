import math


def length(points, order):
    return sum(math.dist(points[order[i - 1]], points[order[i]]) for i in range(len(order)))


# EVOLVE-BLOCK-START
def tour(points):
    """The order to visit the cities in: a list of every index of `points` (each an (x, y) pair) once.
    Visit them sorted by x coordinate."""
    return sorted(range(len(points)), key=lambda i: points[i][0])
# EVOLVE-BLOCK-END
