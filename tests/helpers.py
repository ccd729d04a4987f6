"""Problem folders and runs made on the fly for tests (the plain folders live in evolve.problem.samples)."""

from __future__ import annotations

import ast
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from evolve.problem.samples import (
    GOOD_SEED,
    SPLIT_EVAL,
    SPLIT_TOML,
    SQUARE_SEED,
    SQUARE_TOML,
    write_problem,
    write_square_problem,
)

__all__ = [
    "GOOD_SEED",
    "KNOWN",
    "SPLIT_EVAL",
    "SPLIT_TOML",
    "SQUARE_SEED",
    "SQUARE_TOML",
    "assert_known_vectors",
    "write_problem",
    "write_square_problem",
]

# Programs with distinct vectors on the default test problem (c0: 2 -> 4, c1: 3 -> 9): a reply shifted to
# another job, or a stale one, scores one of them with another's vector.
KNOWN = [
    ("def solve(x):\n    return x * x\n", {"c0": 1.0, "c1": 1.0}),
    ("def solve(x):\n    return 4\n", {"c0": 1.0, "c1": 0.0}),
    ("def solve(x):\n    return 9\n", {"c0": 0.0, "c1": 1.0}),
    ("def solve(x):\n    return -1\n", {"c0": 0.0, "c1": 0.0}),
]


def reported(outcome) -> object:
    """What the candidate returned for case c0 (the test problem echoes it into the feedback)."""
    for line in (outcome.feedback or "").splitlines():
        if line.startswith("c0: "):
            return ast.literal_eval(line[4:])
    raise AssertionError(f"no report: {outcome.error} {outcome.feedback} {outcome.stderr[-300:]}")


def db_rows(db: Path, sql: str) -> list[tuple]:
    """The rows of one query on a run's SQLite archive, the connection closed again."""
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def assert_known_vectors(sandbox: object, problem: object) -> None:
    """Each known program, one after another, gets exactly its own vector (a shifted answer would not)."""
    outcomes = [sandbox.evaluate(problem, code) for code, _ in KNOWN]  # type: ignore[attr-defined]
    seen = [(o.scores, o.error_kind, (o.error or "")[-300:]) for o in outcomes]
    assert [o.scores for o in outcomes] == [want for _, want in KNOWN], seen


@dataclass(frozen=True)
class TinySearch:
    """A finished search: its archive's SQLite file, the problem's fitness components, the run's id, why it
    stopped and the loop's live counters (`evolve.stats.LoopStats`)."""

    db: Path
    components: list
    run_id: int
    reason: str
    stats: object

    def copy_to(self, db: Path) -> Path:
        """A private copy of the archive for a test that writes to it (versions, adapters)."""
        shutil.copy(self.db, db)
        return db


def square_run(tmp_path: Path, **options: object) -> tuple:
    """The square problem, a fresh archive and its run, with the sampling the tiny model was taught for.

    Returns (problem, archive, run, options); keyword arguments override RunOptions fields.
    """
    from evolve.archive import Archive
    from evolve.options import RunOptions
    from evolve.problem import load_problem
    from evolve.runs import open_run

    base: dict[str, object] = dict(
        workers=2,
        group_size=4,
        variants=2,
        max_evaluations=8,
        edit_format="full",
        temperature=0.7,
        max_new_tokens=160,
        seed=0,
        stop_when_solved=False,  # the taught answers solve the square problem; these runs go to their budget
        asks="base",  # the tiny model was taught the directed prompt at 0.7: no other ask arm unless a test asks
        structured="off",  # and to answer in free text: a grammar would change what it writes unless a test asks
    )
    problem = load_problem(write_square_problem(tmp_path / "sq"))
    archive = Archive(tmp_path / "a.db")
    run_options = RunOptions(**{**base, **options})  # type: ignore[arg-type]
    run = open_run(archive, problem, run_options).run
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
        "--no-stop-when-solved",  # the taught answers solve the square problem; these runs go to their budget
        "--allow-weak-sandbox",  # these tests are about the loop; a machine without bubblewrap still runs them
        *extra,
    ]


def hiding_sandbox(kind: str, slots: int) -> object:
    """A process ("process") or Docker sandbox that hides the host's files, or a skip (a failure in CI)."""
    from sandboxes.jail import find_jail
    from sandboxes.process import ProcessSandbox
    from tests.services import missing

    if kind == "process":
        jail, why = find_jail()
        if jail is None:
            missing("bubblewrap", why)
        box = ProcessSandbox(slots=slots)
    else:
        box = docker_sandbox_or_skip(workers=slots)
    assert box.hides_files, box.isolation()  # type: ignore[attr-defined]
    return box


def docker_sandbox_or_skip(**kwargs: object) -> object:
    """A Docker sandbox, or a skip (a failure in CI) that says why none can be had."""
    from sandboxes.docker_pool import DockerSandbox, docker_available
    from tests.services import missing

    reason = docker_available()
    if reason is not None:
        missing("Docker", reason)
    return DockerSandbox(**kwargs)  # type: ignore[arg-type]


EXECUTION_LOG = """

# ---- added by tests.helpers.log_executions: one line per real execution of a candidate ----
_EXECUTION_LOG = {log!r}
_FIRST_CASE = cases()[0]["name"]
_score_unlogged = score


def score(case, output):
    if case["name"] == _FIRST_CASE:
        with open(_EXECUTION_LOG, "a") as log:
            log.write(repr(output) + "\\n")
    return _score_unlogged(case, output)
"""


def log_executions(folder: Path, log: Path) -> Path:
    """Make a split-form problem's evaluator append one line to `log` per real execution of a candidate.

    Archive rows cannot show a second execution of a child (a unique key records it as a `duplicate`); the
    trusted `score()` runs once per case of every execution, outside the sandbox, so its first case writes
    the line. Every program of a test using this must answer the first case (a crash there logs nothing)."""
    evaluator = folder / "evaluate.py"
    evaluator.write_text(evaluator.read_text() + EXECUTION_LOG.format(log=str(log)))
    return log


def executions(log: Path) -> list[str]:
    """What each execution so far returned for the first case, in order (a line is written whole: it is short)."""
    return log.read_text().splitlines() if log.exists() else []


def store_program(
    archive: object,
    run_id: int,
    code: str,
    *,
    evaluation: dict,
    parent_id: int | None = None,
    island: int = 0,
    generation: int = 0,
    variant_id: int | None = None,
    multi_file: bool = False,
) -> tuple[int, bool]:
    """One evaluated program through the archive's one insert path; (id, created) as the batch returns it.
    `multi_file`: the run's problem is one of several files (then the program is stored as its files)."""
    from evolve.archive import NewProgram
    from evolve.archive.records import EvaluationRecord

    record = EvaluationRecord(**{"error_kind": None, "error": None, "sandbox": "test", **evaluation})
    item = NewProgram(code, parent_id, island, generation, variant_id, record)
    [result] = archive.add_evaluated_programs(run_id, [item], multi_file)  # type: ignore[attr-defined]
    return result


def refuse_version_rows(db: Path, refuse: bool) -> None:
    """Make the archive's SQLite database refuse (or accept again) new policy version rows: a real failure after
    a training step's adapter was written and published, which the step must undo."""
    import sqlite3

    con = sqlite3.connect(db)
    if refuse:
        con.execute(
            "CREATE TRIGGER refuse_versions BEFORE INSERT ON policy_versions "
            "BEGIN SELECT RAISE(ABORT, 'version rows refused'); END"
        )
    else:
        con.execute("DROP TRIGGER refuse_versions")
    con.commit()
    con.close()


def host_binds_seen_from_venv(venv: Path, copies: bool = False) -> tuple[str, dict[str, str]]:
    """Make a virtual environment at `venv` (its interpreter symlinked, or copied) and return what
    `sandboxes.docker_images.host_binds()` answers in the engine run from it: the container's interpreter and
    every read-only bind of the base image built there."""
    import json
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)]
    subprocess.run([*command, *(["--copies"] if copies else [])], check=True, timeout=120)
    probe = "import json; from sandboxes.docker_images import host_binds; print(json.dumps(host_binds()))"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        check=True,
    )
    python, binds = json.loads(out.stdout)
    return python, binds


def need_llama() -> None:
    """A skip (a failure in CI) when llama-cpp-python cannot be imported."""
    from tests.services import missing

    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError) as exc:
        missing("llama-cpp-python", f"{exc}; pip install 'vpo-evolve[llama]' (scripts/setup.sh builds it)")


def gguf_copy(model_dir: Path, target_dir: Path) -> Path:
    """The model's directory (tokenizer, config, safetensors) with the model written as GGUF next to them."""
    import shutil

    from policies.gguf_export import write_model_gguf

    shutil.copytree(model_dir, target_dir)
    return write_model_gguf(target_dir, target_dir / "model.gguf")


def save_tiny(directory: Path, **kwargs: object) -> Path:
    """An untaught tiny model and its tokenizer saved in `directory` (keyword arguments go to `tiny_model`)."""
    from policies.tiny import tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    model = tiny_model(tokenizer, **kwargs)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def weak_sandbox_or_skip(**kwargs: object) -> object:
    """A process sandbox without bubblewrap (WEAK). As root whose interpreter other uids cannot reach it refuses
    to start, by design (it would run candidates as root; tests/test_weak_refusal.py checks that): the test is then
    left to the unprivileged pass, which must run its file. Any other refusal is a failure."""
    import os

    from sandboxes.process import ProcessSandbox
    from sandboxes.sandbox import SandboxRefused
    from tests.services import left_to_the_unprivileged_pass

    try:
        return ProcessSandbox(jail=False, **kwargs)  # type: ignore[arg-type]
    except SandboxRefused as exc:
        assert os.geteuid() == 0 and "as root" in str(exc), exc
    left_to_the_unprivileged_pass("as root the WEAK sandbox refuses to run here (it would run candidates as root)")


# Completions of one prompt for the trainer's tests: ragged, one of length 1.
RAGGED_COMPLETIONS = [[8, 9, 10, 11, 12], [200, 1, 2, 3, 4, 5, 6, 7, 8], [77], [13, 14, 15]]


def randomise_lora_b(model: object, seed: int, scale: float) -> None:
    """Give every LoRA B matrix random values: a fresh adapter's B is zero, so it changes no output and its first
    step's gradient reaches neither A nor the layers below."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # type: ignore[attr-defined]
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)


def simple_form_toml(components: tuple[str, str], timeout_s: int) -> str:
    """problem.toml of a simple-form problem (`evaluate(program_path)`, one seed.py) scored on two components in
    [0, 1]: the attack suites pose it with their own component names and timeouts."""
    first, second = components
    return (
        '\nname = "simple"\ndescription = "Square the input."\n[program]\nfile = "seed.py"\n[fitness]\n'
        f'components = [{{ name = "{first}", bounds = [0.0, 1.0] }}, {{ name = "{second}", bounds = [0.0, 1.0] }}]\n'
        f"[limits]\ntimeout_s = {timeout_s}\nmemory_mb = 512\n"
    )


def downgrade_archive(db: Path, revision: str) -> None:
    """Take the SQLite archive `db` down to migration `revision`: an archive of an earlier version, which the next
    `Archive(db)` upgrades again."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine

    from evolve.archive.database import MIGRATIONS

    engine = create_engine(f"sqlite:///{db}")
    try:
        with engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(MIGRATIONS))
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
    finally:
        engine.dispose()
