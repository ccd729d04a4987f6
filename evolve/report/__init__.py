"""See a search: the HTML report (`evolve report --html`) and the live dashboard (`evolve serve`).

Both render the same views from the archive alone. Everything heavy (running bests, Pareto fronts,
MAP-Elites grids, time buckets) is aggregated here on the server side, so the page stays small at 100k
programs; the browser only draws what it is given.
"""
