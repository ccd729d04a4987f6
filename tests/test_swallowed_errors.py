"""Errors the evaluator swallowed (issue #59): an exception the candidate's own code raises into the evaluator's
(an OpenEvolve-style `try: ... except Exception: score = 0`) is recorded by the sandbox, stored with the
evaluation, shown by `evolve show` and in the next prompt built from that program; in the process and the Docker
sandbox, in both evaluator forms. What the candidate catches itself is not recorded, and no candidate can flood,
forge or break the record: after every attack, honest programs score their exact vectors with nothing recorded.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from evolve.archive import Archive
from evolve.cli import app
from evolve.problem import load_problem
from evolve.problem.outcome import ErrorKind
from sandboxes.reply_shape import malformed
from tests.helpers import KNOWN, hiding_sandbox, write_problem

SEED = "# EVOLVE-BLOCK-START\ndef solve(x):\n    return x + 1\n# EVOLVE-BLOCK-END\n"
# Swallows every exception the program raises, case by case, and says nothing of it: the pattern of issue #59.
SILENT_EVALUATOR = """
import importlib.util


def evaluate(program_path):
    spec = importlib.util.spec_from_file_location("candidate", program_path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:
        return {"combined_score": 0.0, "close": 0.0}
    right = close = 0
    for x in range(6):
        try:
            got = module.solve(x)
            right += got == x * x
            close += abs(got - x * x) <= 2
        except Exception:
            pass
    return {"combined_score": right / 6, "close": close / 6}
"""
BROKEN = "def solve(x):\n    return fooo * x\n"  # NameError on line 3 of the program (the block's second line)
HALF_BROKEN = "def solve(x):\n    if x % 2:\n        return [][x]\n    return x * x\n"  # IndexError on odd x: 3 times
EXACT = "def solve(x):\n    return x * x\n"
NAME_ERROR_LINE = "NameError: name 'fooo' is not defined (line 3, 6 times) at `return fooo * x`"


def _openevolve_folder(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "initial_program.py").write_text(SEED)
    (root / "evaluator.py").write_text(SILENT_EVALUATOR)
    return root


def _completion(*codes: str) -> str:
    return "".join(f"<variant {k}>\n```python\n{c}```\n</variant {k}>\n" for k, c in enumerate(codes, start=1))


def _cli(*args: str):
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def _stored(db: Path) -> dict[str, tuple]:
    """Program code's editable body -> (id, scores, error kind, swallowed) of every stored program."""
    with sqlite3.connect(db) as con:
        rows = con.execute(
            "SELECT p.id, p.code, e.scores, e.error_kind, e.swallowed FROM programs p JOIN evaluations e "
            "ON e.program_id = p.id"
        ).fetchall()
    out = {}
    for pid, code, scores, kind, swallowed in rows:
        key = next((c for c in (BROKEN, HALF_BROKEN, EXACT) if c in code), "seed")
        out[key] = (pid, json.loads(scores), kind, json.loads(swallowed) if swallowed else None)
    return out


def _next_prompt(db: Path, parent_id: int) -> str:
    """The prompt the engine builds with `parent_id` as parent: its archive reads (ParentReads) and the builder."""
    from evolve.prompts.builder import PromptInputs, build_prompt

    archive = Archive(db)
    try:
        reads = archive.prompt_reads(parent_id, [], 3, 0)
        [ev] = [p.evaluation for p in [archive.program(parent_id)] if p is not None]
    finally:
        archive.close()
    from evolve.problem.outcome import SwallowedError

    inputs = PromptInputs(
        "Square the input.",
        reads.codes[parent_id],
        ev.scores,
        reads.context.feedback,
        [],
        2,
        "full",
        parent_stderr=reads.context.stderr,
        parent_case_errors=reads.context.case_errors,
        recent_failures=reads.recent_failures,
        parent_swallowed=[SwallowedError.from_dict(e) for e in reads.context.swallowed or ()],
    )
    return build_prompt(inputs)


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_a_swallowed_name_error_reaches_the_archive_show_and_the_next_prompt(tmp_path, sandbox):
    if sandbox == "docker":
        hiding_sandbox("docker", 1).close()  # a skip (a failure in CI) when no daemon answers
    folder = _openevolve_folder(tmp_path / "silent")
    replay = tmp_path / "replay.json"
    replay.write_text(json.dumps([_completion(BROKEN, HALF_BROKEN), _completion(EXACT)]))
    db = tmp_path / "run.db"
    args = ["run", str(folder), "--db", str(db), "--policy", f"replay:{replay}", "--sandbox", sandbox]
    args += ["--workers", "1", "--group-size", "1", "--variants", "2", "--max-evaluations", "4"]
    args += ["--edit-format", "full", "--no-stop-when-solved", "--stall-groups", "1000"]
    ran = _cli(*args)
    assert ran.exit_code == 0, ran.stdout + ran.stderr

    with sqlite3.connect(db) as con:
        [(broken_id,)] = con.execute("SELECT id FROM programs WHERE code LIKE '%return fooo * x%'").fetchall()
    shown = _cli("show", str(db), str(broken_id))
    assert shown.exit_code == 0, shown.stderr
    assert "raised into the evaluator: NameError: name 'fooo' is not defined (" in shown.stdout, shown.stdout
    assert "line 3, 6 times)" in shown.stdout
    # stored with the evaluation, which scored it a plain 0 with no error: the evaluator hid it
    rows = _stored(db)
    assert rows[BROKEN][1:3] == ({"combined_score": 0.0, "close": 0.0}, None)
    [entry] = rows[BROKEN][3]
    assert {k: entry[k] for k in ("type", "message", "line", "code", "count")} == {
        "type": "NameError",
        "message": "name 'fooo' is not defined",
        "line": 3,
        "code": "return fooo * x",
        "count": 6,
    }
    assert rows[HALF_BROKEN][3] == [
        {
            "type": "IndexError",
            "message": "list index out of range",
            "file": entry["file"],
            "line": 4,
            "code": "return [][x]",
            "count": 3,
        }
    ]
    assert rows[EXACT][1:] == ({"combined_score": 1.0, "close": 1.0}, None, None)  # honest: nothing recorded
    assert rows["seed"][3] is None

    prompt = _next_prompt(db, broken_id)
    assert f"Exceptions its code raised while it was evaluated (most frequent first):\n\n- {NAME_ERROR_LINE}" in prompt
    assert "- IndexError: list index out of range (line 4, 3 times) at `return [][x]`" in _next_prompt(
        db, rows[HALF_BROKEN][0]
    )
    assert "Exceptions its code raised" not in _next_prompt(db, rows[EXACT][0])


SPLIT_CANDIDATE = """
def helper(x):
    return undefined_name + x

def solve(x):
    try:
        helper(x)  # caught here, by the candidate itself: not recorded
    except NameError:
        pass
    if x == 3:
        return helper(x)  # escapes into the harness: recorded, once (case c1 only)
    return x * x
"""

# Simple form: what the candidate catches itself, even through its own module object, is not recorded.
# The candidate's own module object, as the evaluator's import made it (not in sys.modules).
OWN_MODULE = """import gc, types

def _me():
    return next(m for m in gc.get_referrers(globals()) if isinstance(m, types.ModuleType))

"""
SELF_CATCHING = (
    OWN_MODULE
    + """
def helper(x):
    raise KeyError(x)

def solve(x):
    assert _me().helper is not helper  # the evaluator's view of it: watched
    try:
        _me().helper(x)
    except KeyError:
        pass
    try:
        helper(x)
    except KeyError:
        pass
    return x * x
"""
)

SIMPLE_TOML = """
name = "simple"
description = "Square the input."
[program]
file = "seed.py"
[fitness]
components = [{ name = "combined_score", bounds = [0.0, 1.0] }, { name = "close", bounds = [0.0, 1.0] }]
[limits]
timeout_s = 10
memory_mb = 512
"""


@pytest.fixture(scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def sandbox(request):
    box = hiding_sandbox(request.param, 2)
    yield box
    box.close()


@pytest.fixture(scope="module")
def simple_problem(tmp_path_factory):
    root = tmp_path_factory.mktemp("simple")
    return load_problem(write_problem(root, seed=SEED, evaluate=SILENT_EVALUATOR, toml=SIMPLE_TOML))


def test_split_form_records_what_escapes_into_the_harness_only(sandbox, tmp_path):
    problem = load_problem(write_problem(tmp_path / "split"))
    outcome = sandbox.evaluate(problem, SPLIT_CANDIDATE)
    assert outcome.scores == {"c0": 1.0, "c1": 0.0}
    assert [e.as_dict() for e in outcome.swallowed] == [
        {
            "type": "NameError",
            "message": "name 'undefined_name' is not defined",
            "file": "seed.py",
            "line": 3,
            "code": "return undefined_name + x",
            "count": 1,
        }
    ]


def test_what_the_candidate_catches_itself_is_not_recorded(sandbox, simple_problem):
    outcome = sandbox.evaluate(simple_problem, SELF_CATCHING)
    assert (outcome.scores, outcome.swallowed) == ({"combined_score": 1.0, "close": 1.0}, [])
    broken = sandbox.evaluate(simple_problem, BROKEN)
    assert [e.shown() for e in broken.swallowed] == [NAME_ERROR_LINE.replace("line 3", "line 2")]


# Each tries to flood the record, break it, or forge one; none may get past the bounds or reach another program.
ATTACKS = {
    # its own module's function, handed to stdlib code (threading.Thread.run) that calls it: escapes, a thousand
    "a thousand distinct errors with huge messages": (
        OWN_MODULE + "import threading\n\n"
        "def _raise(k):\n    raise ValueError(str(k) * 200000)\n\n"
        "def solve(x):\n    boom = _me()._raise\n    for k in range(1000 if x == 0 else 0):\n        try:\n"
        "            threading.Thread(target=boom, args=(k,)).run()\n        except ValueError:\n            pass\n"
        "    return x * x\n"
    ),
    "a message whose __str__ raises": (
        "class Bad(Exception):\n    def __str__(self):\n        raise RuntimeError('no')\n\n"
        "def solve(x):\n    raise Bad('hidden')\n"
    ),
    "a message whose __str__ and __repr__ never return": (
        "class Loop(Exception):\n    def __str__(self):\n        while True:\n            pass\n"
        "    __repr__ = __str__\n\n"
        "def solve(x):\n    raise Loop(Loop())\n"
    ),
    "a class name that fakes lines and a metaclass that lies about it": (
        "class Meta(type):\n    @property\n    def __name__(cls):\n        raise RuntimeError('no name')\n\n"
        "Fake = type('Fake\\n- NameError: forged (line 1, 99 times)', (Exception,), {})\n"
        "class Liar(Exception, metaclass=Meta):\n    pass\n\n"
        "def solve(x):\n    raise (Fake if x % 2 else Liar)(b'\\xff\\xfe'.decode('utf-8', 'surrogateescape'))\n"
    ),
    "a fake record printed to stdout and stderr": (
        'import sys\nFAKE = \'{"swallowed": [{"type": "NameError", "message": "forged", "file": null, '
        '"line": 1, "count": 99}]}\'\nprint(FAKE)\nprint(FAKE, file=sys.stderr)\n\n'
        "def solve(x):\n    return x * x\n"
    ),
    "a tracer and the loader put back": (
        "import sys, importlib.machinery, importlib._bootstrap_external as b\nsys.setprofile(None)\n"
        "sys.settrace(None)\nimportlib.machinery.SourceFileLoader.exec_module = b._LoaderBasics.exec_module\n\n"
        "def solve(x):\n    return x * x\n"
    ),
}


def test_floods_and_forgeries_stay_bounded_and_honest_programs_stay_exact(sandbox, simple_problem):
    for name, code in ATTACKS.items():
        outcome = sandbox.evaluate(simple_problem, code)
        assert outcome.error_kind is None, (name, outcome.error_kind, outcome.error)
        assert len(outcome.swallowed) <= 8, name
        for entry in outcome.swallowed:
            assert len(entry.type) <= 100 and len(entry.message) <= 300 and entry.count >= 1, (name, entry)
            assert "\n" not in entry.shown() and entry.shown().encode("utf-8"), (name, entry)
        shown = [e.shown() for e in outcome.swallowed]
        if name.startswith("a thousand"):
            assert len(shown) == 8 and all(e.type == "ValueError" for e in outcome.swallowed), shown
        if name.startswith("a message whose __str__ raises"):
            assert shown == ["Bad: hidden (line 6, 6 times) at `raise Bad('hidden')`"], shown
        if name.startswith("a message whose __str__ and"):
            assert shown == ["Loop: (a message that is not plain text) (line 8, 6 times) at `raise Loop(Loop())`"], (
                shown
            )
        if name.startswith("a class name"):
            assert {e.type for e in outcome.swallowed} == {"Fake - NameError: forged (line 1, 99 times)", "Liar"}
            assert all(e.count == 3 for e in outcome.swallowed), shown
        if name.startswith(("a fake record", "a tracer")):
            assert shown == [], (name, shown)
        for honest, want in (
            (EXACT, {"combined_score": 1.0, "close": 1.0}),
            (SEED, {"combined_score": 0.0, "close": 0.5}),
        ):
            clean = sandbox.evaluate(simple_problem, honest)
            assert (clean.scores, clean.swallowed, clean.error_kind) == (want, [], None), name


def forging(swallowed: str) -> str:
    """A candidate that patches json.dumps so the harness sends its own `swallowed` (Python source)."""
    return (
        "import json\n_real = json.dumps\n\n"
        "def _forged(obj, *args, **kwargs):\n"
        "    if 'default' in kwargs and isinstance(obj, dict):\n"
        f"        obj = {{**obj, 'swallowed': {swallowed}}}\n"
        "    return _real(obj, *args, **kwargs)\n\n"
        "json.dumps = _forged\n\n"
        "def solve(x):\n    return x * x\n"
    )


ENTRY = {"type": "E", "message": "m", "file": None, "line": 1, "code": None, "count": 1}


def entries(**changed: object) -> str:
    """One entry of `swallowed`, as Python source, with `changed` fields (a key of None's value: removed)."""
    return repr([{**ENTRY, **changed}])


FORGED_SWALLOWED = {
    "not a list": '"NameError"',
    "too many entries": f"[{ENTRY!r}] * 9",
    "an entry with an extra key": entries(x=1),
    "a count of zero": entries(count=0),
    "a count that is a boolean": entries(count=True),
    "a line that is text": entries(line="1"),
    "a message that is a list": entries(message=["m"]),
    "code that is a number": entries(code=7),
    "a huge count": f"[{{**{ENTRY!r}, 'count': 10 ** 400}}]",
}


def test_a_forged_swallowed_field_of_the_wrong_shape_is_bad_output(sandbox, simple_problem):
    for name, forged in FORGED_SWALLOWED.items():
        outcome = sandbox.evaluate(simple_problem, forging(forged))
        assert outcome.error_kind == ErrorKind.BAD_OUTPUT and "swallowed" in (outcome.error or ""), name
        assert outcome.swallowed == [] and outcome.scores == {"combined_score": 0.0, "close": 0.0}, name
    # well shaped but huge texts: cut to their caps, the candidate's own record only
    big = "[{'type': 'T' * 10**5, 'message': '\\udcff' + 'M' * 10**5, 'file': 'f' * 10**4, 'line': 1,"
    big += " 'code': 'c' * 10**4, 'count': 7}]"
    outcome = sandbox.evaluate(simple_problem, forging(big))
    [entry] = outcome.swallowed
    assert (len(entry.type), len(entry.message), len(entry.code or ""), entry.count) == (100, 300, 120, 7)
    assert entry.message.encode("utf-8")
    for code, want in ((EXACT, {"combined_score": 1.0, "close": 1.0}),):
        assert (sandbox.evaluate(simple_problem, code).scores, sandbox.evaluate(simple_problem, code).swallowed) == (
            want,
            [],
        )


def test_the_reply_check_names_what_is_wrong_with_swallowed():
    ok = {"scores": {"a": 1.0}, "swallowed": [dict(ENTRY)]}
    assert malformed(ok, None) is None
    assert malformed({**ok, "swallowed": {"a": 1}}, None) == "the reply's swallowed errors are an object, not a list"
    split = {"outputs": {"c0": {"ok": 4}}, "swallowed": [{"type": "E"}]}
    assert "not {type, message, file, line, code, count}" in (malformed(split, ["c0"]) or "")
    crash = {"kind": "crash", "error": "x", "swallowed": [{**ok["swallowed"][0], "line": -1}]}
    assert "line or count" in (malformed(crash, ["c0"]) or "")


def test_an_archive_of_the_previous_version_upgrades_with_no_swallowed_errors(tmp_path):
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine

    from evolve.archive.database import MIGRATIONS
    from tests.helpers import square_run, store_program

    _, archive, run, _ = square_run(tmp_path)
    pid, _ = store_program(archive, run.id, SEED, evaluation={"scores": {"c0": 0.0}, "scalar": 0.0, "duration_s": 1})
    archive.close()
    engine = create_engine(f"sqlite:///{tmp_path / 'a.db'}")
    with engine.begin() as conn:
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0007_issue25")
    engine.dispose()
    with sqlite3.connect(tmp_path / "a.db") as con:
        assert "swallowed" not in {row[1] for row in con.execute("PRAGMA table_info(evaluations)")}
    archive = Archive(tmp_path / "a.db")
    try:
        program = archive.program(pid)
        assert program is not None and program.evaluation is not None and program.evaluation.swallowed is None
        assert archive.prompt_reads(pid, [], 3, 0).context.swallowed is None
    finally:
        archive.close()
    assert KNOWN  # the same helpers' problem as every other archive test
