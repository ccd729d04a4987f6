"""The one error a malformed problem folder raises."""


class ProblemError(Exception):
    """A malformed problem folder; `str()` is a single line fit for the terminal."""
