"""Tools for the project's own tests and benchmarks, no part of a run.

Tests and benchmarks import nothing from each other (pyproject's independence contract), so what both need
lives here, in the installed package, once: a throw-away PostgreSQL cluster (`postgres_cluster`), a tiny
archive with real groups (`smoke_archive`) and the exact test across a few runs (`exact_test`). The small
problem folders they write live in `evolve.problem.samples`.
"""
