"""The code hash across versions of its normalisation, and against text built to break it: an archive hashed
the old way resumes and catches renamed copies; names reached without their spelling stay in the hash; programs
too deep to parse and lone surrogates still get one. (tests/test_codehash.py holds the pairs that define it.)"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import sqlite3
import textwrap

import pytest

from evolve.archive.codehash import HASH_VERSION, CodeHasher, normalize, normalized_hash
from evolve.archive.program_store import HashUpgrade


def h(code: str) -> str:
    return normalized_hash(textwrap.dedent(code))


def test_unparseable_text_keeps_the_line_normalisation_and_every_hash_names_its_version():
    assert normalize("def f(:\n\n   x = 1   \n") == "def f(:\n   x = 1"
    assert normalized_hash("def f(:\n") == normalized_hash("def f(:   \n\n")
    assert h("x = 1\n").startswith(HASH_VERSION) and len(h("x = 1\n")) == 64


def _version_1_hash(code: str) -> str:
    """The hash the archive stored before local names counted (layout and comments only)."""
    return hashlib.sha256(ast.unparse(ast.parse(code)).encode()).hexdigest()


def test_a_run_stored_under_the_old_normalisation_resumes_and_catches_renamed_copies(tmp_path):
    """An archive written before this normalisation (its hashes bare sha256 hex) is brought up to date on resume:
    a variant that renames a stored program's locals is a duplicate of it. Two stored programs that the new
    normalisation finds equal both stay; the older takes the new hash, the later keeps its old one."""
    from evolve.loop import SearchLoop
    from policies.replay import ReplayPolicy
    from tests.helpers import SQUARE_SEED, store_program
    from tests.test_loop_parts import answer, block, wired

    stored = "def solve(x):\n    y = x * x\n    return y\n"
    twin = "def solve(x):\n    z = x * x  # the same, renamed\n    return z\n"
    renamed = "def solve(x):\n    sq = x * x\n    return sq\n"
    new = "def solve(x):\n    w = x * x\n    return w + 0\n"
    loop = wired(tmp_path, ["-"], group_size=1, variants=2)
    db = sqlite3.connect(tmp_path / "a.db")
    scored = {"scores": {"c0": 1.0, "c1": 1.0}, "scalar": 1.0, "duration_s": 0.1}
    try:
        ids = []
        for code in (SQUARE_SEED, block(stored), block(twin)):  # as the old engine stored them, one by one
            ids.append(
                store_program(loop.archive, loop.run.id, code, evaluation=scored, parent_id=(ids or [None])[0])[0]
            )
            db.execute("UPDATE programs SET code_hash = ? WHERE id = ?", (_version_1_hash(code), ids[-1]))
            db.commit()
        assert len(set(ids)) == 3
        resumed = SearchLoop(
            loop.problem, loop.archive, ReplayPolicy([answer(renamed, new)]), loop.sandbox, loop.run, loop.options
        )
        resumed.ledger.replay(resumed.writer.replay())
        group = asyncio.run(resumed.group(0, resumed.members[0], resumed.members[0].base))
        assert group is not None and group.statuses == {"duplicate": 1, "ok": 1}
        assert [c.code for c in group.children] == [block(new)]
        assert db.execute("SELECT program_id FROM variants WHERE status = 'duplicate'").fetchall() == [(ids[1],)]
        hashes = dict(db.execute("SELECT id, code_hash FROM programs").fetchall())
        assert hashes[ids[0]] == normalized_hash(SQUARE_SEED) and hashes[ids[1]] == normalized_hash(block(twin))
        assert hashes[ids[2]] == _version_1_hash(block(twin))  # equal to the older one now: it keeps its old hash
        assert loop.archive.upgrade_code_hashes(loop.run.id) == HashUpgrade(upgraded=0, kept=1)
    finally:
        db.close()
        loop.sandbox.close()
        loop.archive.close()


# Found by attacking the hash from outside: names reached without their spelling, and deep programs.
DISGUISED = {
    "locals through a built-up getattr": (
        'def f():\n    x = 1\n    return getattr(print.__self__, "loc" + "als")()\n',
        'def f():\n    y = 1\n    return getattr(print.__self__, "loc" + "als")()\n',
    ),
    "the code object through a built-up attribute name": (
        'import operator\ndef f():\n    x = 1\nprint(operator.attrgetter("__co" + "de__")(f).co_names)\n',
        'import operator\ndef f():\n    y = 1\nprint(operator.attrgetter("__co" + "de__")(f).co_names)\n',
    ),
    "an UnboundLocalError's message names the local": (
        "def f():\n    try:\n        x\n        x = 1\n    except UnboundLocalError as e:\n        return str(e)\n",
        "def f():\n    try:\n        y\n        y = 1\n    except UnboundLocalError as e:\n        return str(e)\n",
    ),
}


@pytest.mark.parametrize("pair", DISGUISED.values(), ids=DISGUISED.keys())
def test_a_program_that_can_read_names_without_spelling_them_keeps_them(pair):
    first, second = pair
    assert h(first) != h(second)


DEEP = "1" + " + 1" * 1200  # deeper than the parser's and the renamer's recursion allow


def test_a_program_too_deep_to_parse_is_hashed_as_written_with_its_strings_intact():
    """Blank lines and trailing blanks inside a string literal are part of the program's behaviour."""
    first = f"S = '''a\n\nb'''\nprint(repr(S), {DEEP})\n"
    second = f"S = '''a\nb'''\nprint(repr(S), {DEEP})\n"
    assert h(first) != h(second)
    assert h(first.replace("b'''", "b   '''")) != h(first)


def test_any_text_gets_a_hash_lone_surrogates_and_all():
    """Model output decoded from JSON can hold a lone surrogate; hashing it must not raise (a raise in the
    committer would stop the run)."""
    for code in ("x = '\ud800'\n", "def f(:\n    '\udfff'\n", f"x = '\ud800' + {DEEP}\n"):
        assert h(code).startswith(HASH_VERSION) and h(code) == CodeHasher().hash(code)


def _version_3_hash(code: str) -> str:
    """The hash the archive stored before docstrings were set aside (local names canonical, docstrings kept)."""
    from evolve.archive.local_names import canonicalize

    tree = ast.parse(code)
    canonicalize(tree)
    return "v3" + hashlib.sha256(ast.unparse(tree).encode()).hexdigest()[:62]


def test_a_run_stored_before_docstrings_were_set_aside_resumes_and_catches_documented_copies(tmp_path):
    """An archive whose hashes are version 3 (docstrings counted) is rehashed on resume: a variant that only
    adds a docstring to a stored program is a duplicate of it, and is not evaluated."""
    from evolve.loop import SearchLoop
    from policies.replay import ReplayPolicy
    from tests.helpers import SQUARE_SEED, store_program
    from tests.test_loop_parts import answer, block, wired

    stored = "def solve(x):\n    return x * x\n"
    documented = 'def solve(x):\n    """Square it."""\n    return x * x\n'
    new = "def solve(x):\n    return x * x + 0\n"
    loop = wired(tmp_path, ["-"], group_size=1, variants=2)
    db = sqlite3.connect(tmp_path / "a.db")
    scored = {"scores": {"c0": 1.0, "c1": 1.0}, "scalar": 1.0, "duration_s": 0.1}
    try:
        ids = []
        for code in (SQUARE_SEED, block(stored)):
            ids.append(
                store_program(loop.archive, loop.run.id, code, evaluation=scored, parent_id=(ids or [None])[0])[0]
            )
            db.execute("UPDATE programs SET code_hash = ? WHERE id = ?", (_version_3_hash(code), ids[-1]))
            db.commit()
        resumed = SearchLoop(
            loop.problem, loop.archive, ReplayPolicy([answer(documented, new)]), loop.sandbox, loop.run, loop.options
        )
        resumed.ledger.replay(resumed.writer.replay())
        group = asyncio.run(resumed.group(0, resumed.members[0], resumed.members[0].base))
        assert group is not None and group.statuses == {"duplicate": 1, "ok": 1}
        assert [c.code for c in group.children] == [block(new)]
        assert db.execute("SELECT program_id FROM variants WHERE status = 'duplicate'").fetchall() == [(ids[1],)]
    finally:
        db.close()
        loop.sandbox.close()
        loop.archive.close()
