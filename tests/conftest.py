"""Shared fixtures: a tiny model taught to answer the test problem's prompt (built once per session)."""

from __future__ import annotations

import pytest

from evolve.prompts import PromptInputs, build_prompt
from tests.helpers import SQUARE_SEED

TEACH_STEPS = 300
TARGETS = [
    ("x * x", "x ** 2"),
    ("x + x", "4"),
    ("x * x + 0", "abs(x) * x"),
    ("x ** 2 + 0", "x * 2"),
    ("x * x * 1", "x - 1"),
    ("pow(x, 2)", "x * 3 - 2"),
]


def tiny_pairs() -> list[tuple[str, str]]:
    """Each answer after prompts of the shapes the loop makes: bare, with feedback, with an inspiration."""
    other = SQUARE_SEED.replace("x + 1", "x * 3")
    prompts = [
        build_prompt(PromptInputs("Square the input.", SQUARE_SEED, {"c0": 0.0, "c1": 0.0}, None, [], 2, "full")),
        build_prompt(
            PromptInputs("Square the input.", SQUARE_SEED, {"c0": 0.0, "c1": 1.0}, "c0: 3\nc1: 9", [], 2, "full")
        ),
        build_prompt(
            PromptInputs(
                "Square the input.",
                other,
                {"c0": 1.0, "c1": 0.0},
                "c0: 4\nc1: 6",
                [(SQUARE_SEED, {"c0": 0.0, "c1": 0.0})],
                2,
                "full",
            )
        ),
    ]
    pairs = []
    for i, (a, b) in enumerate(TARGETS):
        completion = "".join(
            f"<variant {k}>\n```python\ndef solve(x):\n    return {expr}\n```\n</variant {k}>\n"
            for k, expr in ((1, a), (2, b))
        )
        pairs += [(prompts[(i + j) % len(prompts)], completion) for j in range(len(prompts))]
    return pairs


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from policies.tiny import build_taught_model

    return build_taught_model(tmp_path_factory.mktemp("tiny"), tiny_pairs(), steps=TEACH_STEPS)
