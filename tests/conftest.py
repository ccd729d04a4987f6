"""Shared fixtures: a tiny model taught to answer the test problem's prompt (built once per session)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

# One torch thread, here and in every engine subprocess a test starts (unless the caller sets another count).
# The suite's models are tiny (hidden 128, 2 layers): a matrix product takes microseconds, and with two OpenMP
# threads on a 2-core machine that is also running sandboxed candidates, servers and other suites, every product
# waits for a busy second core. Measured on the loaded 2-core machine: test_row_stops' stop-string test took
# 50.6 s with 2 threads and 5.9 s with 1 (the same tokens, the same asserts).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Under pytest-xdist (the README's command runs two workers) each worker's llama.cpp takes one thread: two
# workers' two-thread decodes on two cores wait on each other's busy core, about ten times slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("EVOLVE_LLAMA_THREADS", "1")

from evolve.prompts import PromptInputs, ShownProgram, build_prompt
from tests.helpers import SQUARE_SEED, TinySearch

TEACH_STEPS = 500
TARGETS = [
    ("x * x", "x ** 2"),
    ("x + x", "4"),
    ("x * x + 0", "abs(x) * x"),
    ("x ** 2 + 0", "x * 2"),
    ("x * x * 1", "x - 1"),
    ("pow(x, 2)", "x * 3 - 2"),
]


def tiny_pairs() -> list[tuple[str, str]]:
    """Each taught answer after many prompt shapes the loop makes: different parents, scores, feedback, zero to
    two inspirations, with and without recent children, so that the sampled answers parse whatever the search
    has found so far."""
    exprs = ["x + 1", "x * x", "x + x", "4", "x * 2", "x ** 2"]
    programs = [SQUARE_SEED.replace("x + 1", e) for e in exprs]
    prompts = []
    for i, parent in enumerate(programs):
        scores = {"c0": float(i % 2), "c1": float(i // 3 % 2)}
        feedback = None if i == 0 else f"c0: {i + 3}\nc1: {2 * i}"
        others = [ShownProgram(programs[(i + k) % len(programs)], {"c0": 1.0, "c1": 0.0}) for k in range(1, 1 + i % 3)]
        # After the first group a parent has children: the prompt then shows them just before the closing line.
        recent = [programs[(i + 2) % len(programs)]] if i % 2 else []
        prompts.append(
            build_prompt(PromptInputs("Square the input.", parent, scores, feedback, others, 2, "full", recent=recent))
        )
    pairs = []
    for i, (a, b) in enumerate(TARGETS):
        completion = "".join(
            f"<variant {k}>\n```python\ndef solve(x):\n    return {expr}\n```\n</variant {k}>\n"
            for k, expr in ((1, a), (2, b))
        )
        pairs += [(prompts[(i + j) % len(prompts)], completion) for j in range(len(prompts))]
    return pairs


@pytest.fixture(scope="session")
def tiny_model_dir():
    from policies.tiny import build_taught_model

    # Kept between sessions (keyed by everything that shapes it), since teaching it is the suite's largest cost.
    cache = Path(os.environ.get("EVOLVE_TEST_CACHE", Path.home() / ".cache" / "vpo-evolve" / "test-models"))
    cache.mkdir(parents=True, exist_ok=True)
    return build_taught_model(cache, tiny_pairs(), steps=TEACH_STEPS)


@pytest.fixture(scope="session")
def tiny_search(tiny_model_dir, tmp_path_factory) -> TinySearch:
    """A short search by the taught tiny model (8 evaluations on the process sandbox), made once. test_loop checks
    what it archived (read-only); the tests that train on an archive's groups copy it rather than each paying for a
    search of its own. The run records the tiny model as its policy, so `evolve train` finds it."""
    from evolve.loop import SearchLoop, run_search
    from policies.transformers_policy import TransformersPolicy
    from sandboxes.process import ProcessSandbox
    from tests.helpers import square_run

    root = tmp_path_factory.mktemp("tiny-search")
    problem, archive, run, options = square_run(root, max_evaluations=8, policy=f"transformers:{tiny_model_dir}")
    loop = SearchLoop(problem, archive, TransformersPolicy.load(str(tiny_model_dir)), ProcessSandbox(2), run, options)
    reason = run_search(loop)
    archive.close()
    return TinySearch(root / "a.db", list(problem.components), run.id, reason, loop.stats)


@pytest.fixture(scope="session")
def tiny_gguf(tiny_model_dir, tmp_path_factory):
    """The taught tiny model with a GGUF copy of its weights, for the llama.cpp policy (read-only: shared)."""
    from tests.helpers import gguf_copy, need_llama

    need_llama()
    return gguf_copy(tiny_model_dir, tmp_path_factory.mktemp("gguf") / "tiny")


@pytest.fixture(scope="session")
def endless_model_dir(tmp_path_factory):
    """An untaught tiny model that cannot reach its end-of-sequence token: it writes until told to stop."""
    from policies.tiny import tiny_tokenizer
    from tests.helpers import save_tiny

    return save_tiny(tmp_path_factory.mktemp("endless"), vocab_size=len(tiny_tokenizer()) - 2)


@pytest.fixture(scope="session")
def postgres_cluster():
    """One throw-away PostgreSQL cluster for the session; a skip (a failure in CI) when it cannot start."""
    from evolve.devtools.postgres_cluster import PostgresCluster
    from tests.services import missing

    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing("PostgreSQL", "the psycopg driver is not installed (pip install 'vpo-evolve[postgres]')")
    try:
        cluster = PostgresCluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        missing("PostgreSQL", str(exc))
    yield cluster
    cluster.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """An empty archive location on each database: a SQLite file path, or a fresh PostgreSQL database's URL."""
    if request.param == "sqlite":
        return str(tmp_path / "a.db")
    return request.getfixturevalue("postgres_cluster").new_database()


@pytest.fixture(scope="module")
def initialised(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder made by `evolve init` in a subprocess, as a user makes one, once per module: the unattended-run tests
    copy it (`evolve init` writes the same folder every time; another subprocess would only import the engine again)."""
    from tests.unattended_runs import evolve

    folder = tmp_path_factory.mktemp("init") / "demo"
    made = evolve("init", str(folder))
    assert made.returncode == 0, made.stderr[-2000:]
    return folder
