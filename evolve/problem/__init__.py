"""Problem folders: the format in which a user poses a problem (see docs/problem-format.md)."""

from evolve.problem.blocks import EditableBlock, find_blocks, replace_blocks
from evolve.problem.config import ComponentSpec, ProblemConfig
from evolve.problem.loader import Problem, ProblemError, load_problem

__all__ = [
    "ComponentSpec",
    "EditableBlock",
    "Problem",
    "ProblemConfig",
    "ProblemError",
    "find_blocks",
    "load_problem",
    "replace_blocks",
]
