"""Policies: the LLMs that write variants, and (later) how they are trained."""

from policies.base import Generated, Policy, PolicyError, SamplingParams

__all__ = ["Generated", "Policy", "PolicyError", "SamplingParams"]
