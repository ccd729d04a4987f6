"""Prompts that ask for m diverse variants, and the parser that turns completions into child programs."""

from evolve.prompts.builder import (
    TEMPLATES,
    Composed,
    PromptInputs,
    ShownProgram,
    build_prompt,
    completion_budget,
    completion_stop,
    compose,
    resolve_edit_format,
    safe_blocks,
)
from evolve.prompts.parse_limits import ParseInterrupted
from evolve.prompts.parser import ParsedVariant, parse_completion

__all__ = [
    "TEMPLATES",
    "Composed",
    "ParseInterrupted",
    "ParsedVariant",
    "PromptInputs",
    "ShownProgram",
    "build_prompt",
    "completion_budget",
    "completion_stop",
    "compose",
    "parse_completion",
    "resolve_edit_format",
    "safe_blocks",
]
