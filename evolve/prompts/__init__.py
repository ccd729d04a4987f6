"""Prompts that ask for m diverse variants, and the parser that turns completions into child programs."""

from evolve.prompts.builder import PromptInputs, build_prompt
from evolve.prompts.parser import ParsedVariant, parse_completion

__all__ = ["ParsedVariant", "PromptInputs", "build_prompt", "parse_completion"]
