"""Problem folders made on the fly for tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

SPLIT_TOML = """
name = "{name}"
description = "test problem"
[program]
file = "seed.py"
entry_point = "solve"
[fitness]
components = [{{ name = "c0", bounds = [0.0, 1.0] }}, {{ name = "c1", bounds = [0.0, 1.0] }}]
[limits]
timeout_s = {timeout}
memory_mb = 512
max_processes = 32
"""

# score() echoes what the candidate returned into the feedback, so tests can see what happened inside.
SPLIT_EVAL = """
def cases():
    return [{"name": "c0", "input": 2, "expected": 4}, {"name": "c1", "input": 3, "expected": 9}]

def score(case, output):
    return (1.0 if output == case["expected"] else 0.0), repr(output)[:2000]
"""

GOOD_SEED = """
# EVOLVE-BLOCK-START
def solve(x):
    return x * x
# EVOLVE-BLOCK-END
"""


def write_problem(
    root: Path,
    *,
    seed: str = GOOD_SEED,
    evaluate: str = SPLIT_EVAL,
    toml: str | None = None,
    timeout: float = 3.0,
    name: str = "t",
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "problem.toml").write_text(toml if toml is not None else SPLIT_TOML.format(name=name, timeout=timeout))
    (root / "seed.py").write_text(textwrap.dedent(seed))
    (root / "evaluate.py").write_text(textwrap.dedent(evaluate))
    return root


SQUARE_SEED = """# EVOLVE-BLOCK-START
def solve(x):
    return x + 1
# EVOLVE-BLOCK-END
"""

SQUARE_TOML = """
name = "square"
description = "Square the input."
[program]
file = "seed.py"
[fitness]
components = [{ name = "c0", bounds = [0.0, 1.0] }, { name = "c1", bounds = [0.0, 1.0] }]
[limits]
timeout_s = 5
memory_mb = 512
[search]
islands = 2
migration_interval = 4
group_size = 4
variants = 2
edit_format = "full"
temperature = 0.7
max_new_tokens = 160
"""


def write_square_problem(root: Path) -> Path:
    """The problem the tiny test model was taught to answer."""
    return write_problem(root, seed=SQUARE_SEED, toml=SQUARE_TOML)


def square_run(tmp_path: Path, **options: object) -> tuple:
    """The square problem, a fresh archive and its run, with the sampling the tiny model was taught for.

    Returns (problem, archive, run, options); keyword arguments override RunOptions fields.
    """
    from evolve.archive import Archive
    from evolve.problem import load_problem
    from evolve.runs import RunOptions, open_run

    base: dict[str, object] = dict(
        workers=2,
        group_size=4,
        variants=2,
        max_evaluations=8,
        edit_format="full",
        temperature=0.7,
        max_new_tokens=160,
        seed=0,
    )
    problem = load_problem(write_square_problem(tmp_path / "sq"))
    archive = Archive(tmp_path / "a.db")
    run_options = RunOptions(**{**base, **options})  # type: ignore[arg-type]
    run, _ = open_run(archive, problem, run_options)
    return problem, archive, run, run_options


def evolve_run_cmd(folder: Path, db: Path | str, policy: str, max_evaluations: int, *extra: str) -> list[str]:
    """The `evolve run` command line the subprocess tests start, on the process sandbox."""
    import sys

    return [
        sys.executable,
        "-m",
        "evolve.cli",
        "run",
        str(folder),
        "--db",
        str(db),
        "--policy",
        policy,
        "--sandbox",
        "process",
        "--max-evaluations",
        str(max_evaluations),
        *extra,
    ]


def docker_sandbox_or_skip(**kwargs: object) -> object:
    """A Docker sandbox, or a skip (a failure in CI) that says why none can be had."""
    from sandboxes.docker_pool import DockerSandbox, docker_available
    from tests.services import missing

    reason = docker_available()
    if reason is not None:
        missing("Docker", reason)
    return DockerSandbox(**kwargs)  # type: ignore[arg-type]
