"""vpo-evolve: LLM-driven evolutionary program search with vector fitness."""

__version__ = "0.1.0"
