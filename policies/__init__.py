"""Policies: the LLMs that write variants (backends), the advantage estimators, and the trainer that updates them.

This package imports nothing from `evolve/`: the engine hands it prompts and training groups.
"""

from policies.policy import Generated, Policy, PolicyError, SamplingParams

__all__ = ["Generated", "Policy", "PolicyError", "SamplingParams"]
