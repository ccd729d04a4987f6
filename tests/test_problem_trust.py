"""A problem folder is untrusted input (issue #57, findings 3, 8, 9 and 11): it names no file outside itself, its
name is no path, a policy server it names gets no API key unless the user says so, its config.yaml cannot blow up
on aliases, and bytes that are not UTF-8 get one line naming the file and the offset, never a traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from evolve.options import RunOverrides
from evolve.problem import ProblemError, load_problem
from evolve.problem.openevolve_config import read_config
from evolve.problem.scaffold import scaffold
from evolve.search import SearchSetupError, build_search
from tests.helpers import GOOD_SEED, SPLIT_EVAL, db_rows, write_problem

EVOLVE = [sys.executable, "-m", "evolve.cli"]
KEY = f"sk-trust-test-{uuid.uuid4().hex}"
# The full-format answer every chat request gets: a child that returns 4 scores exactly (c0 1.0, c1 0.0).
ANSWER = "<variant 1>\n```python\ndef solve(x):\n    return 4\n```\n</variant 1>\n"
TOML = """
name = "{name}"
description = "test problem"
[program]
file = "{seed}"
entry_point = "solve"
[evaluator]
file = "{evaluator}"
[fitness]
components = [{{ name = "c0", bounds = [0.0, 1.0] }}, {{ name = "c1", bounds = [0.0, 1.0] }}]
[limits]
timeout_s = 5
memory_mb = 512
max_processes = 32
[search]
edit_format = "full"
variants = 1
group_size = 1
"""


def folder_with(tmp_path: Path, *, seed: str = "seed.py", evaluator: str = "evaluate.py", name: str = "t") -> Path:
    """An honest split-form folder (its seed squares: c0 1.0, c1 1.0) whose problem.toml names `seed` and
    `evaluator`; beside it, `secret/token.py` holds a token that must never leave this machine, in a file that
    is a valid seed too (so a run that read it would go on and put it in its prompts)."""
    secret = tmp_path / "secret"
    secret.mkdir(exist_ok=True)
    (secret / "token.py").write_text(GOOD_SEED.replace("def solve", f"# TOKEN-{uuid.uuid4().hex}\ndef solve"))
    (secret / "evil.py").write_text(SPLIT_EVAL)
    toml = TOML.format(name=name, seed=seed, evaluator=evaluator)
    return write_problem(tmp_path / "p", toml=toml)


def secret_text(tmp_path: Path) -> str:
    found = re.search(r"TOKEN-[0-9a-f]+", (tmp_path / "secret" / "token.py").read_text())
    assert found is not None
    return found.group(0)


def one_line(message: str) -> str:
    assert "\n" not in message.strip() and "Traceback" not in message, message
    return message


# ---- finding 3: files outside the folder ---------------------------------------------------------------------
@pytest.mark.parametrize(
    ("section", "named"),
    [
        ("seed", "../secret/token.py"),
        ("seed", "{tmp}/secret/token.py"),
        ("seed", "link.py"),  # a symlink inside the folder pointing out of it
        ("evaluator", "../secret/evil.py"),
        ("evaluator", "{tmp}/secret/evil.py"),
        ("evaluator", "link.py"),
    ],
)
def test_a_seed_or_evaluator_outside_the_folder_is_refused_in_one_line(tmp_path, section, named):
    named = named.format(tmp=tmp_path)
    folder = folder_with(tmp_path, **{section: named})
    target = "token.py" if section == "seed" else "evil.py"
    (folder / "link.py").symlink_to(tmp_path / "secret" / target)
    with pytest.raises(ProblemError) as err:
        load_problem(folder)
    said = one_line(str(err.value))
    assert "inside the problem folder" in said or "leads outside the problem folder" in said, said
    assert secret_text(tmp_path) not in said


def test_a_data_folder_or_problem_toml_linked_out_of_the_folder_is_refused(tmp_path):
    folder = folder_with(tmp_path)
    (folder / "data").symlink_to(tmp_path / "secret")  # the sandbox would show it to every candidate
    with pytest.raises(ProblemError, match="leads outside the problem folder") as err:
        load_problem(folder)
    one_line(str(err.value))
    (folder / "data").unlink()
    real = tmp_path / "elsewhere.toml"
    (folder / "problem.toml").rename(real)
    (folder / "problem.toml").symlink_to(real)
    with pytest.raises(ProblemError, match="leads outside the problem folder"):
        load_problem(folder)


def test_a_policy_file_in_problem_toml_outside_the_folder_is_refused_before_anything_loads(tmp_path):
    folder = folder_with(tmp_path)
    outside = tmp_path / "secret" / "replay.json"
    outside.write_text(json.dumps({"completions": [ANSWER]}))
    for spec in ("replay:../secret/replay.json", f"replay:{outside}", "llama:~/model.gguf"):
        toml = (folder / "problem.toml").read_text().split("[[search.policies]]")[0]
        (folder / "problem.toml").write_text(toml + f'[[search.policies]]\nspec = "{spec}"\n')
        with pytest.raises(SearchSetupError) as err:
            build_search(load_problem(folder), RunOverrides(sandbox="process"), db=tmp_path / "a.db")
        assert "inside the problem folder" in one_line(str(err.value)), str(err.value)
        assert spec.partition(":")[2] in str(err.value)


# ---- finding 3: credentials go only where the user pointed them -------------------------------------------------
class _Recorder(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat server on loopback that answers every request ANSWER (n choices) and keeps each
    request's path, headers and body."""

    seen: ClassVar[list[tuple[str, dict[str, str], str]]] = []

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.seen.append((self.path, dict(self.headers), ""))
        self._send({"object": "list", "data": [{"id": "m", "object": "model"}]})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        self.seen.append((self.path, dict(self.headers), raw))
        n = int(json.loads(raw or "{}").get("n", 1))
        choice = {"message": {"role": "assistant", "content": ANSWER}, "finish_reason": "stop"}
        self._send({"choices": [{**choice, "index": i} for i in range(n)]})

    def _send(self, payload: Any) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    handler = type("Handler", (_Recorder,), {"seen": []})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd, handler.seen
    httpd.shutdown()
    httpd.server_close()


def _run(folder: Path, db: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OPENAI_API_KEY": KEY}
    env.pop("EVOLVE_API_KEY", None)
    command = [*EVOLVE, "run", str(folder), "--db", str(db), "--sandbox", "process", "--allow-weak-sandbox"]
    command += ["--max-groups", "1", "--max-evaluations", "3", "--no-stop-when-solved", "--asks", "base"]
    command += ["--structured", "off", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)


def _with_policy(folder: Path, spec: str) -> None:
    with (folder / "problem.toml").open("a") as toml:
        toml.write(f'[[search.policies]]\nspec = "{spec}"\n')


def _child_vectors(db: Path) -> list[tuple[str, dict[str, float]]]:
    query = "SELECT p.code, e.scores FROM evaluations e JOIN programs p ON p.id = e.program_id ORDER BY p.id"
    rows = db_rows(db, query)
    return [(code.strip().splitlines()[-2].strip(), json.loads(scores)) for code, scores in rows]


HONEST = [("return x * x", {"c0": 1.0, "c1": 1.0}), ("return 4", {"c0": 1.0, "c1": 0.0})]


def _authorizations(seen: list[tuple[str, dict[str, str], str]]) -> list[str | None]:
    return [{k.lower(): v for k, v in headers.items()}.get("authorization") for _path, headers, _body in seen]


def test_a_problem_folder_reading_a_host_file_for_its_own_server_sends_nothing(tmp_path, server):
    """The red team's folder: the seed is a host file and the policy a server it names. Refused at load, in one
    line: no request at all, so neither the key nor the file's text leaves."""
    httpd, seen = server
    folder = folder_with(tmp_path, seed="../secret/token.py")
    _with_policy(folder, f"openai:http://127.0.0.1:{httpd.server_port}/v1@m")
    out = _run(folder, tmp_path / "a.db")
    assert not any(secret_text(tmp_path) in body for _path, _headers, body in seen)
    assert _authorizations(seen) == []
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert "inside the problem folder" in one_line(out.stderr)


def test_the_key_goes_only_to_servers_the_user_named(tmp_path, server):
    """A server named by the problem folder gets no key and is named in the opening lines; the same server given
    with --policy, or the folder's with --trust-problem-urls, gets it as before. Each run scores the seed
    and its one child exactly as an honest run does."""
    httpd, seen = server
    folder = folder_with(tmp_path)
    url = f"http://127.0.0.1:{httpd.server_port}/v1"
    _with_policy(folder, f"openai:{url}@m")
    out = _run(folder, tmp_path / "a.db")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert seen and _authorizations(seen) == [None] * len(seen)
    assert not any(KEY in body or secret_text(tmp_path) in body for _path, _headers, body in seen)
    opening = out.stdout.split("structured sampling")[0]
    assert f"{url} is named by the problem folder: sent no API key" in opening, opening
    assert _child_vectors(tmp_path / "a.db") == HONEST
    for extra in (["--policy", f"openai:{url}@m"], ["--trust-problem-urls"]):
        seen.clear()
        out = _run(folder, tmp_path / f"{extra[0]}.db", *extra)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
        assert seen and _authorizations(seen) == [f"Bearer {KEY}"] * len(seen), extra
        assert _child_vectors(tmp_path / f"{extra[0]}.db") == HONEST


# ---- finding 8: the problem's name is no path -----------------------------------------------------------------
@pytest.mark.parametrize("name", ["{tmp}/elsewhere/app", "../app", "a/b", ".hidden", "a b", "x\\\\y", ""])
def test_a_problem_name_that_is_not_a_plain_name_is_refused_in_one_line(tmp_path, name):
    (tmp_path / "elsewhere").mkdir()
    folder = folder_with(tmp_path, name=name.format(tmp=tmp_path))
    with pytest.raises(ProblemError) as err:
        load_problem(folder)
    said = one_line(str(err.value))
    assert "name" in said and "letters, digits" in said, said
    assert list((tmp_path / "elsewhere").iterdir()) == []
    toml = (folder / "problem.toml").read_text().splitlines()
    (folder / "problem.toml").write_text("\n".join(['name = "my_problem-2.v1"', *toml[2:]]))
    assert load_problem(folder).name == "my_problem-2.v1"  # the fix the line asks for is enough


def test_init_names_a_spaced_folder_s_problem_with_a_plain_name(tmp_path):
    """`evolve init DIR` names the problem after its folder: a folder with a space (or brackets) still makes a
    folder that loads, its name made plain."""
    scaffold(tmp_path / "my [b]problem")
    assert load_problem(tmp_path / "my [b]problem").name == "my-b-problem"


# ---- finding 9: an OpenEvolve config.yaml cannot blow up ----------------------------------------------------------
def _bomb(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "\n".join([*lines, f"max_iterations: *a{levels - 1}"]) + "\n"


def test_a_yaml_alias_bomb_is_refused_at_once_in_one_line(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(_bomb(7))  # 9**7 strings once expanded
    start = time.monotonic()
    with pytest.raises(ProblemError) as err:
        read_config(config)
    assert time.monotonic() - start < 2.0
    said = one_line(str(err.value))
    assert "alias" in said and "line 2" in said and str(config) in said, said


def test_yaml_or_toml_nested_too_deeply_is_one_line(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("max_iterations: " + "[" * 5000 + "\n")
    with pytest.raises(ProblemError) as err:
        read_config(config)
    assert "nested" in one_line(str(err.value))
    folder = folder_with(tmp_path)
    (folder / "problem.toml").write_text("x = " + "[" * 5000 + "\n")
    with pytest.raises(ProblemError) as err:
        load_problem(folder)
    assert "nested" in one_line(str(err.value))


# ---- finding 11: bytes that are not UTF-8 ----------------------------------------------------------------------
def _evolve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLVE, *args], capture_output=True, text=True, timeout=120)


def _eval(folder: Path, program: Path) -> subprocess.CompletedProcess[str]:
    return _evolve("eval", str(folder), str(program), "--sandbox", "process", "--allow-weak-sandbox", "--json")


@pytest.mark.parametrize("broken", ["problem.toml", "evaluate.py", "seed.py"])
def test_a_folder_file_that_is_not_utf8_is_one_line_naming_it_and_the_offset(tmp_path, broken):
    folder = folder_with(tmp_path)
    path = folder / broken
    text = path.read_bytes()
    path.write_bytes(text[:7] + b"\xff" + text[7:])
    out = _evolve("check", str(folder), "--sandbox", "process", "--allow-weak-sandbox")
    assert out.returncode == 2
    said = one_line(out.stderr)
    assert str(path) in said and "byte offset 7" in said and "UTF-8" in said, said
    path.write_bytes(text)  # the same folder, mended, scores the seed's exact vector
    out = _eval(folder, folder / "seed.py")
    assert out.returncode == 0 and json.loads(out.stdout)["scores"] == {"c0": 1.0, "c1": 1.0}, out.stderr


def test_an_eval_program_that_is_not_utf8_is_one_line_and_honest_ones_score_exactly(tmp_path):
    folder = write_problem(tmp_path / "p", seed=GOOD_SEED)
    program = tmp_path / "cand.py"
    program.write_bytes(b"def solve(x):\n    return 4  # \xe9\n")
    out = _eval(folder, program)
    assert out.returncode == 2
    said = one_line(out.stderr)
    assert str(program) in said and "byte offset 30" in said, said
    for code, vector in HONEST:
        program.write_text(f"def solve(x):\n    {code}\n")
        out = _eval(folder, program)
        assert out.returncode == 0 and json.loads(out.stdout)["scores"] == vector, out.stderr
