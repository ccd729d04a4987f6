"""The engine's own secrets stay out of the candidate's reach, with `evolve eval` itself under attack (issue 22).

The attacked engine is a real `python -m evolve.cli eval` subprocess holding three markers: one in its
environment, one on its command line (the program file's name) and one in a file it holds open that exists
nowhere else (unlinked before the engine starts). The candidate scans every /proc/PID/environ, cmdline and open
file it can, and reads the problem's evaluate.py by its host path; each count is a component of the score
vector, so the assertion is on exact numbers, never on a feedback text that may be cut. A control component
proves the scan can see: the candidate starts a process of its own with a control marker in all three places,
and must find it in each.

Jailed, the interpreter is the one the issue's user had: a `.venv` in a checkout under /work. Without
bubblewrap (WEAK), an unprivileged engine runs the candidate as its own uid (--allow-weak-sandbox), which must
still read no engine secret (the answers it may read: that is what WEAK says); a root engine refuses instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes.jail import find_jail
from tests.layouts import env_for, layout_venv
from tests.probes import probe_problem
from tests.services import left_to_the_unprivileged_pass, missing

PROBES = ("environ", "cmdline", "fd", "answers", "control")
# The markers travel reversed in the candidate's code, so no process holding that code matches them.
CANDIDATE = """import os, stat, subprocess, sys, tempfile, time
FOUND = {}
def _found(marker, skip):
    hits = {"environ": 0, "cmdline": 0, "fd": 0}
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == skip:
            continue
        for name in ("environ", "cmdline"):
            try:
                with open(f"/proc/{pid}/{name}", "rb") as f:
                    hits[name] += marker.encode() in f.read()
            except OSError:
                pass
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            try:
                if stat.S_ISREG(os.stat(f"/proc/{pid}/fd/{fd}").st_mode):  # never a pipe: it could block
                    with open(f"/proc/{pid}/fd/{fd}", "rb") as f:
                        hits["fd"] += marker.encode() in f.read(1 << 20)
            except OSError:
                pass
    return hits
def _scan():
    env, arg, held = [m[::-1] for m in MARKERS]
    control = "control-" + env[4:]
    # The control: a process of our own that holds the control marker in all three places.
    with tempfile.NamedTemporaryFile("w", dir="/tmp" if os.path.isdir("/tmp") else None) as f:
        f.write(control)
        f.flush()
        child = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1]); time.sleep(60)",
                                  f.name, control], env={**os.environ, "EVOLVE_CONTROL": control})
        time.sleep(1.0)
        seen = _found(control, os.getpid())
        child.kill()
        child.wait()
    counts = {name: hits for name, hits in _found(env, os.getpid()).items() if name == "environ"}
    counts["cmdline"] = _found(arg, os.getpid())["cmdline"]
    counts["fd"] = _found(held, os.getpid())["fd"]
    counts["control"] = int(all(seen.values()))
    counts["answers"] = 0
    try:
        with open(ANSWERS) as f:
            counts["answers"] = int("def score" in f.read())
    except OSError:
        pass
    return counts
def solve(what):
    if not FOUND:
        FOUND.update(_scan())
    return FOUND[what]
"""
CLEAN = {"environ": 0.0, "cmdline": 0.0, "fd": 0.0, "answers": 0.0, "control": 1.0}


@pytest.fixture(scope="module")
def work_venv() -> Iterator[Path]:
    with layout_venv("work") as python:
        yield python


def attack(python: Path, tmp_path: Path, *flags: str, path: str | None = None) -> subprocess.CompletedProcess:
    """Run `evolve eval` on the probing candidate with the three markers in place; returns the finished process."""
    problem = probe_problem(tmp_path / "probe", PROBES)
    env_marker, arg_marker, fd_marker = (f"{kind}-{uuid.uuid4().hex}" for kind in ("env", "arg", "fd"))
    program = tmp_path / f"candidate-{arg_marker}.py"
    code = CANDIDATE.replace("MARKERS", repr([m[::-1] for m in (env_marker, arg_marker, fd_marker)]))
    program.write_text(code.replace("ANSWERS", repr(str(problem / "evaluate.py"))))
    held = tmp_path / "held-secret"
    held.write_text(fd_marker)
    fd = os.open(held, os.O_RDONLY)
    held.unlink()  # from now on only the engine's descriptor reaches it
    env = env_for(python, EVOLVE_TEST_SECRET=env_marker)
    if path is not None:
        env["PATH"] = path
    try:
        return subprocess.run(
            [str(python), "-m", "evolve.cli", "eval", str(problem), str(program), "--sandbox", "process", *flags],
            capture_output=True,
            text=True,
            timeout=240,
            env=env,
            pass_fds=(fd,),
        )
    finally:
        os.close(fd)


@pytest.mark.slow  # a virtual environment and evolve subprocesses
def test_a_jailed_candidate_finds_no_engine_secret(work_venv, tmp_path):
    if find_jail()[0] is None:
        missing("bubblewrap", find_jail()[1])
    out = attack(work_venv, tmp_path, "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["scores"] == CLEAN and "WEAK" not in got["isolation"], got


@pytest.mark.slow  # a virtual environment and evolve subprocesses
def test_without_a_jail_the_candidate_finds_no_engine_secret_or_does_not_run(work_venv, tmp_path):
    no_bwrap = tmp_path / "bin"
    no_bwrap.mkdir()
    out = attack(work_venv, tmp_path, "--json", "--allow-weak-sandbox", path=str(no_bwrap))
    if os.geteuid() == 0 and out.returncode != 0:  # the interpreter is not reachable by other users
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 2 and len(lines) == 1 and "as root" in lines[0], out.stderr
        assert "install bubblewrap" in lines[0] and out.stdout == "", out.stderr
        left_to_the_unprivileged_pass("as root the WEAK sandbox refuses to run the attack here")
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert "WEAK" in got["isolation"], got
    assert got["scores"] == {**CLEAN, "answers": 1.0}, got  # WEAK: the host's files, not the engine's secrets


ENGINE = """import sys, time
from sandboxes.engine_guard import guard_engine
if sys.argv[1] == "guarded":
    guard_engine(shares_proc=True)
print("ready", flush=True)
time.sleep(60)
"""
READER = """import json, sys
pid, env_marker, arg_marker = sys.argv[1:]
found = []
for name, marker in (("environ", env_marker), ("cmdline", arg_marker)):
    try:
        with open(f"/proc/{pid}/{name}", "rb") as f:
            found.append(marker.encode() in f.read())
    except OSError:
        found.append(False)
print(json.dumps(found))
"""


def _without_capabilities() -> None:
    """Between fork and exec: empty the bounding set, so that the program exec'd holds no capability, even as root
    (a uid 0 process gets only what the bounding set allows at exec)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        if libc.prctl(24, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # PR_CAPBSET_DROP; EINVAL: no such cap
            os._exit(99)


@pytest.mark.parametrize("mode, readable", [("plain", [True, True]), ("guarded", [False, False])])
def test_the_engine_guard_hides_its_environment_and_arguments_from_its_own_uid(mode, readable):
    """Another process of the engine's own uid (a WEAK candidate, if it shared the engine's user namespace)
    reads both from a plain engine, neither from a guarded one. As root, engine and reader run without
    capabilities (what root's reader would otherwise bypass the guard with), so the root pass checks the guard too:
    the same uid, neither privileged, as an unprivileged engine and its candidate are."""
    env_marker, arg_marker = f"env-{uuid.uuid4().hex}", f"arg-{uuid.uuid4().hex}"
    env = {**os.environ, "EVOLVE_TEST_SECRET": env_marker}
    drop = _without_capabilities if os.geteuid() == 0 else None
    engine = subprocess.Popen(
        [sys.executable, "-c", ENGINE, mode, arg_marker], stdout=subprocess.PIPE, text=True, env=env, preexec_fn=drop
    )
    try:
        assert engine.stdout is not None and engine.stdout.readline() == "ready\n"
        out = subprocess.run(
            [sys.executable, "-c", READER, str(engine.pid), env_marker, arg_marker],
            capture_output=True,
            text=True,
            timeout=60,
            preexec_fn=drop,
        )
        assert json.loads(out.stdout) == readable, out.stderr
    finally:
        engine.kill()
        engine.wait()
