"""Sandboxes: score one candidate program for a problem into a named vector, whatever the candidate does.

What an evaluation comes to (`EvalOutcome`, `ErrorKind`) lives in `evolve.problem.outcome`, beside the problem
model that reads it too."""

from sandboxes.sandbox import Sandbox

__all__ = ["Sandbox"]
