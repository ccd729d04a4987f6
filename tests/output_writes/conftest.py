"""The two runs every output-write test reads (made once for the package: each is an `evolve run` subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import evolve_run_cmd, write_problem
from tests.output_writes.shell_runs import (
    CLASH_CHILD,
    SH_SEED,
    SH_TOML,
    TREE_CALC,
    TREE_MAIN,
    TREE_TOML,
    TREE_VARIANT,
    full,
    git_tree_child,
    make_run,
    run_engine,
)


@pytest.fixture(scope="package")
def one_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(problem folder, archive, fsmonitor marker) of a one-file run whose children read as trees: the `.git`
    one is best on c0, the `a.sh` one on c1."""
    root = tmp_path_factory.mktemp("one_file")
    marker = root / "FSMONITOR_RAN"
    db = make_run(root, "sh_one", SH_TOML, SH_SEED, "seed.sh", full(git_tree_child(marker), CLASH_CHILD), 2)
    return root / "sh_one", db, marker


@pytest.fixture(scope="package")
def several_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(problem folder, archive) of a run of the two-file problem whose best child squares."""
    root = tmp_path_factory.mktemp("several")
    folder = root / "sh_tree"
    write_problem(folder, seed=TREE_MAIN, toml=TREE_TOML, program_file="main.sh")
    (folder / "lib").mkdir()
    (folder / "lib" / "calc.sh").write_text(TREE_CALC.format(body="$1 + 1"))
    (root / "tree.json").write_text(json.dumps([TREE_VARIANT]))
    db = root / "tree.db"
    cmd = evolve_run_cmd(folder, db, f"replay:{root / 'tree.json'}", 2)
    flags = ["--workers", "1", "--group-size", "1", "--variants", "1", "--edit-format", "full"]
    done = run_engine([*cmd, *flags])
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return folder, db
