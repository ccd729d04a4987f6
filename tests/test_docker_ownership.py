"""The Docker sandbox ends only what it started (issue #57, 6 and 12), and a container slow to start is waited for.

- The job killer's kill(-1) runs in the container's own pid namespace: a host process of the candidate uid lives
  through jobs that leave processes behind, and through a candidate that calls kill(-1) itself.
- An engine takes another engine's containers for orphans only when it can see that engine is dead: not one in
  another pid namespace (a container sharing the daemon and the hostname), whose pids it cannot see.
- A runner slow to say it is ready (a loaded machine: a CI run failed with `SandboxRefused: ... did not start its
  runner`) is waited for, and a line on the channel before its ready line costs the job a rerun, as a stray line
  while idle does, not the sandbox.
Every check ends with the exact vectors of known programs.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import sandboxes.docker_lockdown
import sandboxes.docker_pool
import sandboxes.warm_container
from evolve.problem import load_problem
from evolve.problem.outcome import ErrorKind
from tests.helpers import KNOWN, assert_known_vectors, docker_sandbox_or_skip, reported, write_problem

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[1]
WHO = "import os\ndef solve(x):\n    return os.getuid()\n"
LEAVES_ONE = (  # a child in a session of its own outlives the candidate: the zygote has the killer kill(-1)
    "import os, time\ndef solve(x):\n    if os.fork() == 0:\n        os.setsid()\n        time.sleep(60)\n"
    "        os._exit(0)\n    return x * x\n"
)
KILLS_ALL = "import os, signal\ndef solve(x):\n    os.kill(-1, signal.SIGKILL)\n    return x * x\n"


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(write_problem(tmp_path_factory.mktemp("own"), timeout=5.0))


@pytest.fixture
def sandbox():
    box = docker_sandbox_or_skip(workers=1)
    yield box
    box.close()


def _sleep_as(uid: int) -> subprocess.Popen:
    def become() -> None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)

    return subprocess.Popen(["sleep", "600"], preexec_fn=become)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can start a process as the candidate uid")
def test_a_host_process_of_the_candidate_uid_outlives_the_job_killer_and_kill_minus_one(sandbox, problem):
    uid = reported(sandbox.evaluate(problem, WHO))
    assert isinstance(uid, int) and uid != 0, uid
    bystander = _sleep_as(uid)
    try:
        assert sandbox.evaluate(problem, LEAVES_ONE).scores == {"c0": 1.0, "c1": 1.0}
        assert sandbox.evaluate(problem, KILLS_ALL).scores == {"c0": 1.0, "c1": 1.0}  # it spares only itself
        assert_known_vectors(sandbox, problem)
        assert bystander.poll() is None, bystander.returncode
    finally:
        bystander.kill()
        bystander.wait()


def test_a_container_of_an_engine_in_another_pid_namespace_is_not_taken_for_an_orphan(sandbox, problem):
    """Two containers whose engines' pids this machine's namespace does not have: the one labelled with this pid
    namespace is an orphan (removed by the next engine to start); the one from another namespace may belong to a
    live engine there, and stays."""
    assert_known_vectors(sandbox, problem)  # a container, and so the image, exist
    unseen = next(p for p in range(4_000_000, 1, -1) if not Path(f"/proc/{p}").exists())
    owner = f"{socket.gethostname()}:{unseen}"
    made = {}
    for where in ("here", "elsewhere"):
        pidns = str(os.stat("/proc/self/ns/pid").st_ino) if where == "here" else "4026000001"
        labels = {"vpo-evolve.owner": owner, "vpo-evolve.pidns": pidns}
        made[where] = sandbox.client.containers.create(sandbox.image_spec.tag, ["true"], labels=labels)
    try:
        docker_sandbox_or_skip(workers=1).close()  # a second engine starts: it removes orphans
        left = {c.id for c in sandbox.client.containers.list(all=True, filters={"label": f"vpo-evolve.owner={owner}"})}
        assert left == {made["elsewhere"].id}
    finally:
        for container in made.values():
            sandboxes.warm_container.remove_quietly(container)
    assert_known_vectors(sandbox, problem)


SECOND_ENGINE = """
import sys
from evolve.problem import load_problem
from sandboxes.docker_pool import DockerSandbox
problem = load_problem(sys.argv[1])
box = DockerSandbox(workers=1)
print([box.evaluate(problem, code).scores for code in sys.argv[2:]], flush=True)
box.close()
"""


def test_two_engines_on_one_daemon_leave_each_others_containers_alone(sandbox, problem):
    """A second engine starts, scores, and closes while this one holds a warm container: that container is the
    one that scores this engine's next jobs, exactly."""
    assert_known_vectors(sandbox, problem)
    mine = {c.id for c in sandbox.client.containers.list(filters={"label": f"vpo-evolve.owner={_owner()}"})}
    assert len(mine) == 1
    codes = [code for code, _ in KNOWN]
    other = subprocess.run(
        [sys.executable, "-c", SECOND_ENGINE, str(problem.root), *codes],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert other.returncode == 0, other.stderr[-800:]
    assert other.stdout.strip() == str([want for _, want in KNOWN])
    assert {c.id for c in sandbox.client.containers.list(filters={"label": f"vpo-evolve.owner={_owner()}"})} == mine
    assert_known_vectors(sandbox, problem)


def _owner() -> str:
    return sandboxes.docker_pool.OWNER


RUNNER_PATCH = """    if os.path.exists("/opt/evolve/STRAY"):  # a forged answer before the ready line
        channel.write('{"reply": null, "status": "exit 0", "nonce": "guess"}\\n')
        channel.flush()
    if os.path.exists("/opt/evolve/SLOW"):  # a machine so loaded that the runner takes this long to be ready
        time.sleep(float(open("/opt/evolve/SLOW").read()))
"""


@pytest.fixture
def patched_runner(tmp_path, monkeypatch) -> Path:
    """The sandbox's in-container files, copied, with a runner that writes a stray line before its ready line or
    is slow to say it while a flag file exists in the copy (bound read-only at /opt/evolve in each container)."""
    copy = tmp_path / "evolve"
    shutil.copytree(Path(sandboxes.docker_lockdown.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    copy.chmod(0o755)
    runner = copy / "container_runner.py"
    text = runner.read_text()
    anchor = '    channel.write(json.dumps({"ready": True}) + "\\n")\n'
    assert anchor in text
    runner.write_text(text.replace(anchor, RUNNER_PATCH + anchor))
    monkeypatch.setattr(sandboxes.docker_lockdown, "SANDBOX_DIR", copy)
    return copy


def test_a_runner_slow_to_start_is_waited_for(patched_runner, problem):
    """Ready after 35 s (the engine used to give up after 30 and refuse the sandbox): the job is scored exactly."""
    (patched_runner / "SLOW").write_text("35")
    box = docker_sandbox_or_skip(workers=1)
    try:
        assert box.evaluate(problem, KNOWN[1][0]).scores == KNOWN[1][1]
        (patched_runner / "SLOW").unlink()
        assert_known_vectors(box, problem)
    finally:
        box.close()


def test_a_stray_line_before_the_runner_is_ready_costs_the_job_not_the_sandbox(patched_runner, problem):
    """Every container's channel carries a forged answer before its ready line: the job runs in two containers,
    neither trusted, and is bad output, never a refused sandbox; once the forger is gone, scores are exact."""
    (patched_runner / "STRAY").write_text("")
    box = docker_sandbox_or_skip(workers=1)
    try:
        outcome = box.evaluate(problem, KNOWN[0][0])
        assert outcome.error_kind == ErrorKind.BAD_OUTPUT and "twice" in outcome.error, outcome.error
        assert outcome.scores == {"c0": 0.0, "c1": 0.0}
        (patched_runner / "STRAY").unlink()
        assert_known_vectors(box, problem)
    finally:
        box.close()
