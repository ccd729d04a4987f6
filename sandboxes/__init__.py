"""Sandboxes: score one candidate program for a problem into a named vector, whatever the candidate does."""

from sandboxes.base import ErrorKind, EvalOutcome, Sandbox

__all__ = ["ErrorKind", "EvalOutcome", "Sandbox"]
