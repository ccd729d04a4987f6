"""The small shell problems the output-write tests run, their replayed children, and `evolve` as a user runs it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.forked_cli import FORKED
from tests.helpers import evolve_run_cmd, write_problem

COMPONENTS = '[fitness]\ncomponents = [{ name = "c0", bounds = [0.0, 1.0] }, { name = "c1", bounds = [0.0, 1.0] }]'
LIMITS = "[limits]\ntimeout_s = 5\nmemory_mb = 512\nmax_processes = 32\n"

# One file, no EVOLVE markers: the whole file is the model's to rewrite. Seed: x + 1, which scores (0, 0).
SH_TOML = f"""
name = "sh_one"
description = "print the square of the number on stdin"
[program]
file = "seed.sh"
language = "sh"
[run]
command = ["sh", "seed.sh"]
{COMPONENTS}
{LIMITS}"""
SH_SEED = "read x\necho $((x + 1))\n"

# Two files laid out by `[program] files`: main.sh (fixed) and lib/ (every file under it; lib/calc.sh holds the
# block). Seed: x + 1; the replayed child squares, which scores (1, 1).
TREE_TOML = f"""
name = "sh_tree"
description = "print the square of the number on stdin"
[program]
files = ["main.sh", "lib/"]
language = "sh"
[run]
command = ["sh", "main.sh"]
{COMPONENTS}
{LIMITS}"""
TREE_MAIN = '. ./lib/calc.sh\nread x\ncalc "$x"\n'
TREE_CALC = "# EVOLVE-BLOCK-START\ncalc() {{ echo $(({body})); }}\n# EVOLVE-BLOCK-END\n"
TREE_VARIANT = "<variant 1>\n=== FILE: lib/calc.sh ===\n```sh\ncalc() { echo $(($1 * $1)); }\n```\n</variant 1>\n"


def git_tree_child(marker: Path) -> str:
    """A one-file shell program that reads as a tree holding `.git/config` (a core.fsmonitor command that
    touches `marker`) and `run.sh`. As one file it scores (1, 0): the header and config lines are commands that
    fail, then it reads x and prints 4."""
    return (
        f'=== FILE: .git/config ===\n[core]\n\tfsmonitor = "touch {marker}; false"\n'
        "=== FILE: run.sh ===\nread x\necho 4\n"
    )


# A one-file shell program that reads as a tree with `a.sh` both a file and a folder: it scores (0, 1).
CLASH_CHILD = "=== FILE: a.sh/b ===\n:\n=== FILE: a.sh ===\nread x\necho 9\n"


def full(*bodies: str) -> str:
    """One completion whose variants rewrite the whole program, each in a shell fence."""
    return "".join(f"<variant {i}>\n```sh\n{b}```\n</variant {i}>\n" for i, b in enumerate(bodies, start=1))


def evolve(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`evolve ARGS` in a process of its own, as a user runs it (its stderr is what the user sees); forked from one
    that imported the CLI once (tests/forked_cli.py), since the imports were most of each command's time."""
    return FORKED.run(list(args), cwd=cwd)


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.args, result.stdout, result.stderr)
    return result.stdout


def refused(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """The command's one-line refusal (exit code 2, no traceback), which names each of `words`."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1, (result.returncode, result.stdout, result.stderr)
    assert lines[0].startswith("error: ") and all(w in lines[0] for w in words), (lines[0], words)
    return lines[0]


def make_run(root: Path, name: str, toml: str, seed: str, program_file: str, replay: str, variants: int) -> Path:
    """The problem folder `root/name`, and its archive after one replayed group of `variants` children."""
    folder = write_problem(root / name, seed=seed, toml=toml, program_file=program_file)
    (root / f"{name}.json").write_text(json.dumps([replay]))
    db = root / f"{name}.db"
    cmd = evolve_run_cmd(folder, db, f"replay:{root / name}.json", 1 + variants)
    flags = ["--workers", "1", "--group-size", "1", "--variants", str(variants), "--edit-format", "full"]
    done = run_engine([*cmd, *flags])
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return db


def run_engine(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """An `evolve run` command line of tests.helpers.evolve_run_cmd (`python -m evolve.cli run ...`), run as `evolve`
    runs here."""
    assert cmd[1:3] == ["-m", "evolve.cli"], cmd
    return FORKED.run(cmd[3:], timeout=600)


def scores_of(problem: Path, program: Path) -> dict[str, float]:
    """The score vector `evolve eval` gives the program written at `program` (a file, or a folder of files)."""
    out = ok(evolve("eval", str(problem), str(program), "--sandbox", "process", "--allow-weak-sandbox", "--json"))
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))["scores"]


def stored_code(db: Path, scores: dict[str, float]) -> str:
    """The code of the run's program whose evaluation has exactly `scores`, read back by `evolve best`."""
    component = next(name for name, value in scores.items() if value == 1.0)
    return ok(evolve("best", str(db), "--component", component))
