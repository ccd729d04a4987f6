"""The OpenEvolve compatibility parts one by one: config.yaml mapping and its errors, inferred components,
`evolve init --from`, the EvaluationResult stand-in, feedback from words, fail values, and the schema."""

from __future__ import annotations

import shutil
import sqlite3
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.cli import app
from evolve.problem import load_problem
from evolve.problem.openevolve import load_openevolve
from evolve.problem.openevolve_config import read_config
from sandboxes.process import ProcessSandbox
from tests.helpers import write_problem

FOLDERS = Path(__file__).with_name("openevolve_folders")
SEED = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return x + 1\n# EVOLVE-BLOCK-END\n"
SIMPLE_TOML = """
name = "s"
description = "test problem"
[fitness]
components = [{ name = "c0", fail_value = 0.0 }, { name = "c1", fail_value = -1.0 }]
[limits]
timeout_s = 5
memory_mb = 512
"""


@pytest.fixture(scope="module")
def sandbox():
    box = ProcessSandbox(slots=1)
    yield box
    box.close()


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def _folder(tmp_path: Path, evaluator: str, config: str | None = None) -> Path:
    root = tmp_path / "oe"
    root.mkdir()
    (root / "initial_program.py").write_text(SEED)
    (root / "evaluator.py").write_text(textwrap.dedent(evaluator))
    if config is not None:
        (root / "config.yaml").write_text(textwrap.dedent(config))
    return root


PLAIN = """
def evaluate(program_path):
    return {"combined_score": 0.5, "a": 2.0}
"""


@pytest.mark.parametrize(
    "config,needle",
    [
        ("max_iterations: [1\n", "not valid YAML at line"),
        ("- a\n- b\n", "(top level): expected a mapping"),
        ("database:\n  num_islands: five\n", "database.num_islands: expected an integer >= 1"),
        ("llm:\n  temperature: hot\n", "llm.temperature: expected a number"),
        ("evaluator:\n  cascade_thresholds: 0.5\n", "evaluator.cascade_thresholds: expected a list of numbers"),
        ("evaluator:\n  cascade_evaluation: maybe\n", "evaluator.cascade_evaluation: expected true or false"),
        ("language: rust\n", "programs are not run from an OpenEvolve folder"),
    ],
)
def test_malformed_config_is_one_line_and_exit_2(tmp_path, config, needle):
    root = _folder(tmp_path, PLAIN, config)
    for command in (["check", str(root)], ["eval", str(root), str(root / "initial_program.py")]):
        out = _cli(*command, "--sandbox", "process")
        lines = out.stderr.strip().splitlines()
        assert out.exit_code == 2 and len(lines) == 1, out.stderr
        assert needle in lines[0] and "config.yaml" in lines[0]
    assert sorted(p.name for p in root.iterdir()) == ["config.yaml", "evaluator.py", "initial_program.py"]


def test_ignored_settings_are_reported_once_each_and_mapped_ones_applied(sandbox):
    out = _cli("check", str(FOLDERS / "configured"), "--sandbox", "process")
    assert out.exit_code == 0, out.stderr
    notes = [line for line in out.stderr.splitlines() if line.startswith("note: config.yaml: ")]
    keys = [line.split()[2] for line in notes]
    assert keys == [
        "checkpoint_interval",
        "log_level",
        "llm.models",
        "llm.api_base",
        "llm.api_key",
        "database.population_size",
        "database.migration_rate",
        "evaluator.parallel_evaluations",
        "database.feature_dimensions",  # 'diversity' dropped: no such axis here
    ]
    assert all(" ignored: " in line or " dropped: " in line for line in notes)

    problem, again = load_openevolve(FOLDERS / "configured", lambda p: sandbox.evaluate(p, p.seed_code))
    assert len(again) == len(notes)
    c = problem.config
    assert c.description.startswith("You write Python. Make solve(x) return the square of x")
    assert (c.search.islands, c.search.migration_interval, c.search.max_evaluations) == (3, 5, 50)
    assert (c.search.temperature, c.search.max_new_tokens, c.search.edit_format) == (0.6, 2048, "full")
    assert c.search.features == ["code_length", "accuracy"] and c.search.inspirations == 2
    assert (c.limits.timeout_s, c.evaluator.cascade, c.evaluator.names) == (10.0, False, "lenient")
    assert [(x.name, x.weight) for x in problem.components] == [
        ("combined_score", 1.0),
        ("accuracy", 0.0),
        ("brevity", 0.0),
    ]


def test_mapping_without_a_sandbox():
    mapped = read_config(FOLDERS / "cascade" / "config.yaml")
    assert mapped.search == {"max_evaluations": 20} and mapped.stage_timeout_s == 5.0
    assert mapped.evaluator == {"cascade": True, "cascade_thresholds": [0.6, 0.9]} and mapped.notes == []


def test_unknown_and_section_settings_get_their_reason(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("frobnicate: 1\nllm:\n  top_p: 0.9\ndatabase:\n  shiny: true\nevaluator:\n  cpu_limit: 2\n")
    assert read_config(path).notes == [
        "config.yaml: frobnicate ignored: unknown setting",
        "config.yaml: llm.top_p ignored: sampling uses top_p 0.95",
        "config.yaml: database.shiny ignored: the archive (--db) keeps every program, prompt and evaluation"
        " as it lands",
        "config.yaml: evaluator.cpu_limit ignored: not supported here",
    ]


def test_components_without_combined_score_weigh_equally_and_failures_never_beat_the_seed(tmp_path, sandbox):
    root = _folder(tmp_path, 'def evaluate(program_path):\n    return {"gain": 0.25, "loss": -3.0, "label": "x"}\n')
    problem, notes = load_openevolve(root, lambda p: sandbox.evaluate(p, p.seed_code))
    assert notes == []
    assert [(c.name, c.direction, c.weight, c.failure) for c in problem.components] == [
        ("gain", "maximize", 1.0, 0.0),
        ("loss", "maximize", 1.0, -6.0),
    ]
    timeouts = load_openevolve(FOLDERS / "cascade", lambda p: sandbox.evaluate(p, p.seed_code))[0]
    assert timeouts.config.limits.timeout_s == 15.0  # OpenEvolve's timeout is per stage: 3 stages x 5 s


@pytest.mark.parametrize(
    "evaluator,needle",
    [
        ("def evaluate(program_path):\n    raise RuntimeError('no good')\n", "the seed scored crash"),
        ("def evaluate(program_path):\n    return {'error': 'cannot load'}\n", "no numeric metrics (it said: error"),
        ("def evaluate(program_path):\n    return {'sum of radii': 1.0}\n", "metric name 'sum of radii'"),
        ("def score(program_path):\n    return {}\n", "no evaluate(program_path)"),
    ],
)
def test_unusable_folder_is_one_line_and_exit_2(tmp_path, evaluator, needle):
    root = _folder(tmp_path, evaluator)
    out = _cli("check", str(root), "--sandbox", "process")
    lines = out.stderr.strip().splitlines()
    assert out.exit_code == 2 and len(lines) == 1 and needle in lines[0], out.stderr


def test_init_from_writes_a_problem_toml_that_loads_back_the_same(tmp_path, sandbox):
    copy = tmp_path / "copy"
    out = _cli("init", str(copy), "--from", str(FOLDERS / "configured"), "--sandbox", "process")
    assert out.exit_code == 0, out.stderr
    assert not (FOLDERS / "configured" / "problem.toml").exists()
    inferred, _ = load_openevolve(FOLDERS / "configured", lambda p: sandbox.evaluate(p, p.seed_code))
    written = load_problem(copy)
    assert written.config.model_dump() == {**inferred.config.model_dump(), "name": "configured"}
    outcome = sandbox.evaluate(written, written.seed_code.replace("x + 1", "x * x"))
    assert outcome.ok and outcome.scores["accuracy"] == 1.0

    in_place = tmp_path / "cascade"
    shutil.copytree(FOLDERS / "cascade", in_place)
    assert _cli("init", "--from", str(in_place), "--sandbox", "process").exit_code == 0
    problem = load_problem(in_place)
    assert problem.config.evaluator.cascade_thresholds == [0.6, 0.9]
    assert problem.component_names == ["runs", "small", "medium", "large", "combined_score"]
    again = _cli("init", "--from", str(in_place), "--sandbox", "process")
    assert again.exit_code == 2 and "not an OpenEvolve folder" in again.stderr


def test_the_evaluation_result_stand_in_behaves_like_openevolves():
    from sandboxes.openevolve_shim import EvaluationResult

    r = EvaluationResult.from_dict({"combined_score": 0.5})
    assert r.to_dict() == {"combined_score": 0.5} and not r.has_artifacts()
    r = EvaluationResult(metrics={"a": 1.0}, artifacts={"log": "héllo", "blob": b"\x00\x01"})
    assert r.get_artifact_keys() == ["log", "blob"] and r.get_artifact_size("log") == 6
    assert r.get_total_artifact_size() == 8 and r.get_artifact_size("missing") == 0


@pytest.mark.parametrize(
    "body,scores,kind,feedback",
    [
        # Words are feedback, never bad_output; numpy numbers are numbers.
        (
            "import numpy as np\n    return {'c0': np.float32(0.5), 'c1': np.int64(2), 'why': 'ok', 'hist': [1, 2]}",
            {"c0": 0.5, "c1": 2.0},
            None,
            "why: ok\nhist: [1, 2]",
        ),
        # A failing evaluation reports an error: missing components take their fail values, the text stays.
        (
            "return {'c0': 0.0, 'error': 'boom'}",
            {"c0": 0.0, "c1": -1.0},
            None,
            "error: boom\nnot returned, scored as failures: c1",
        ),
        (
            "return {'error': 'boom'}",
            {"c0": 0.0, "c1": -1.0},
            "invalid",
            "error: boom\nnot returned, scored as failures: c0, c1",
        ),
        # Without an error, a problem.toml's names stay strict (a typo is caught, not scored as a failure).
        ("return {'c0': 1.0, 'c2': 1.0}", {"c0": 0.0, "c1": -1.0}, "bad_output", None),
        (
            "from openevolve.evaluation_result import EvaluationResult\n"
            "    return EvaluationResult({'c0': 1.0, 'c1': 1.0}, {'stderr': b'warn', 'n': 3})",
            {"c0": 1.0, "c1": 1.0},
            None,
            "stderr: warn\nn: 3",
        ),
    ],
)
def test_simple_form_words_and_failures(tmp_path, sandbox, body, scores, kind, feedback):
    root = write_problem(tmp_path / "p", toml=SIMPLE_TOML, evaluate=f"def evaluate(program_path):\n    {body}\n")
    problem = load_problem(root)
    outcome = sandbox.evaluate(problem, problem.seed_code)
    assert outcome.scores == scores and outcome.error_kind == kind, outcome.error
    if feedback is not None:
        assert outcome.feedback == feedback
    if kind == "invalid":
        assert outcome.error == "error: boom"


def test_archive_gains_the_stage_metrics_column(tmp_path):
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine

    from evolve.archive import Archive
    from evolve.archive.database import MIGRATIONS

    db = tmp_path / "old.db"
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")  # an archive made before this change
    engine.dispose()
    with sqlite3.connect(db) as con:
        assert "stages" not in [r[1] for r in con.execute("PRAGMA table_info(evaluations)")]
    Archive(db).close()
    with sqlite3.connect(db) as con:
        assert "stages" in [r[1] for r in con.execute("PRAGMA table_info(evaluations)")]
