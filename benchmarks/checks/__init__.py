"""Checks of the benchmarks' own logic (prompt choice, paired contrasts, bootstrap intervals, kept adapters).

They live here, not in tests/, because benchmarks and tests import nothing from each other (pyproject's import
contract): a test of the engine never depends on a benchmark script, and a benchmark never borrows a test's
fixture. pytest collects this folder too (`testpaths`).
"""
