"""Host configuration and credentials that /usr, the Python installation or a toolchain would bring into a
sandbox: each is planted as root, a candidate reads it and reports what it got, and known programs score their
exact vectors afterwards. CI runs this file as root (the planting needs it) and unprivileged (it skips there).
"""

from __future__ import annotations

import os
import stat
import sys
import uuid
from pathlib import Path

import pytest

from evolve.problem import load_problem
from sandboxes.host_config import empty_file
from tests.helpers import assert_known_vectors, hiding_sandbox, reported, write_problem


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    return load_problem(write_problem(tmp_path_factory.mktemp("host_config"), timeout=3.0))


@pytest.mark.parametrize("kind", ["process", "docker"])
def test_pip_conf_directly_under_usr_reads_empty(kind, problem):
    """pip reads `{sys.prefix}/pip.conf`: a Python installed under /usr/local keeps its index URL (and token) in
    /usr/local/pip.conf, which came in with /usr. The candidate reads both such files and reports what it got."""
    planted = [Path(p) for p in ("/usr/pip.conf", "/usr/local/pip.conf") if not os.path.lexists(p)]
    if not os.access("/usr/local", os.W_OK):
        pytest.skip("planting /usr/local/pip.conf needs root (the root pass of .ci/run plants it)")
    code = (
        "def solve(x):\n    got = {}\n    for p in ('/usr/pip.conf', '/usr/local/pip.conf'):\n        try:\n"
        "            got[p] = open(p).read()\n        except OSError as e:\n            got[p] = type(e).__name__\n"
        "    return got\n"
    )
    box = None
    try:
        for path in planted:
            path.write_text("[global]\nindex-url = https://user:pip-token-5120@index.example/simple\n")
        box = hiding_sandbox(kind, 1)  # after planting: a container masks what exists when it starts
        got = reported(box.evaluate(problem, code))
        assert got == {"/usr/pip.conf": "", "/usr/local/pip.conf": ""}, got
        assert_known_vectors(box, problem)
    finally:
        if box is not None:
            box.close()
        for path in planted:
            path.unlink(missing_ok=True)


@pytest.mark.parametrize("kind", ["process", "docker"])
def test_credentials_kept_elsewhere_under_usr_or_in_the_python_installation_are_out_of_reach(kind, problem):
    """Found by a red-team pass: a /usr/local/pip.conf that is a link to a file under /usr, npm's /usr/etc/npmrc and
    cargo's /usr/local/cargo/credentials.toml came in with /usr in both sandboxes; in the process sandbox, a link
    to a file at the top of the engine's Python installation was remade at /opt/python, and its `etc` came in.
    The candidate reads each and reports what it got: empty, or not there."""
    tag = uuid.uuid4().hex[:8]
    base = Path(sys.base_prefix).resolve()
    link, cargo = Path("/usr/local/pip.conf"), Path("/usr/local/cargo/credentials.toml")
    if not os.access("/usr/local", os.W_OK) or not os.access(base, os.W_OK) or str(base).startswith("/usr/"):
        pytest.skip("planting under /usr and in a Python installation outside /usr needs root (the root pass does)")
    if os.path.lexists(link) or os.path.lexists(cargo):
        pytest.skip("this host keeps a /usr/local/pip.conf or cargo credentials of its own")
    made = [d for d in (Path("/usr/etc"), cargo.parent, base / "etc") if not d.exists()]
    target = Path(f"/usr/local/lib/evolve-attack-{tag}.conf")
    npmrc = Path(f"/usr/etc/evolve-attack-{tag}-npmrc")
    top, top_target = base / f"evolve-attack-{tag}.conf", base / "share" / f"evolve-attack-{tag}.conf"
    in_etc = base / "etc" / f"evolve-attack-{tag}.conf"
    paths = [
        str(link),
        str(target),
        str(npmrc),
        str(cargo),
        f"/opt/python/{top.name}",
        f"/opt/python/etc/{in_etc.name}",
    ]
    code = (
        f"def solve(x):\n    got = {{}}\n    for p in {paths!r}:\n        try:\n"
        "            got[p] = open(p).read()\n        except OSError as e:\n            got[p] = type(e).__name__\n"
        "    return got\n"
    )
    box = None
    try:
        for folder in made:
            folder.mkdir()
        for secret in (target, npmrc, cargo, top_target, in_etc):
            secret.write_text(f"token = red-team-{tag}\n")
        link.symlink_to(target)
        top.symlink_to(top_target.relative_to(base))
        box = hiding_sandbox(kind, 1)  # after planting: a container masks what exists when it starts
        got = reported(box.evaluate(problem, code))
        gone = "FileNotFoundError"
        assert got == dict(zip(paths, ["", "", gone, "", gone, gone], strict=True)), got
        assert_known_vectors(box, problem)
    finally:
        if box is not None:
            box.close()
        for planted in (link, top, target, npmrc, cargo, top_target, in_etc):
            planted.unlink(missing_ok=True)
        for folder in reversed(made):
            folder.rmdir()


@pytest.mark.parametrize("kind", ["process", "docker"])
def test_a_hidden_folder_or_file_that_is_a_link_neither_stops_the_sandbox_nor_shows(kind, problem, monkeypatch):
    """Found by a second red-team pass: a hidden config folder that was a link (`/usr/etc -> /etc`) made bubblewrap
    refuse every job (it cannot mount on a link), and in Docker covered the container's own /etc; a credential file
    reached through a linked hidden folder made bubblewrap fail too, as would a hidden folder inside another. Links
    are followed to what they lead to."""
    import sandboxes.host_config as jail

    if not os.access("/usr/local", os.W_OK):
        pytest.skip("planting links under /usr/local needs root (the root pass of .ci/run plants them)")
    tag = uuid.uuid4().hex[:8]
    out_of_usr = Path(f"/usr/local/evolve-attack-{tag}-etc")  # a link to the host's /etc
    real = Path(f"/usr/local/share/evolve-attack-{tag}")  # a real config folder, reached through a link
    linked = Path(f"/usr/local/evolve-attack-{tag}-conf")
    secret = Path(f"/usr/local/evolve-attack-{tag}.conf")  # -> the linked folder's pip.conf
    nested = Path(f"/usr/local/evolve-attack-{tag}-nested")  # -> a folder inside the linked one
    configs = (str(out_of_usr), str(linked), str(nested))
    monkeypatch.setattr(jail, "HOST_CONFIG_UNDER_USR", (*jail.HOST_CONFIG_UNDER_USR, *configs))
    monkeypatch.setattr(jail, "HOST_FILES_UNDER_USR", (*jail.HOST_FILES_UNDER_USR, str(secret)))
    probes = [str(secret), f"{real}/pip.conf"] + (["/etc/passwd"] if kind == "docker" else [])  # the image's own
    code = (
        f"def solve(x):\n    got = {{}}\n    for p in {probes!r}:\n"
        "        try:\n            got[p] = len(open(p).read()) > 0\n"
        "        except OSError as e:\n            got[p] = type(e).__name__\n    return got\n"
    )
    box = None
    try:
        out_of_usr.symlink_to("/etc")
        real.mkdir()
        (real / "pip.conf").write_text(f"index-url = https://u:token-{tag}@index.example\n")
        (real / "sub").mkdir()
        linked.symlink_to(f"share/{real.name}")
        nested.symlink_to(f"share/{real.name}/sub")
        secret.symlink_to(f"{linked.name}/pip.conf")
        box = hiding_sandbox(kind, 1)
        got = reported(box.evaluate(problem, code))
        want = {str(secret): "FileNotFoundError", f"{real}/pip.conf": "FileNotFoundError", "/etc/passwd": True}
        assert got == {p: want[p] for p in probes}, got
        assert_known_vectors(box, problem)
    finally:
        if box is not None:
            box.close()
        for link in (secret, linked, nested, out_of_usr):
            link.unlink(missing_ok=True)
        (real / "pip.conf").unlink(missing_ok=True)
        for folder in (real / "sub", real):
            if folder.exists():
                folder.rmdir()


def test_the_empty_file_bound_over_pip_conf_is_made_again_when_a_tmp_cleaner_removed_it():
    """A run left alone for weeks outlives /tmp cleaners; a bind whose source is gone would stop every candidate."""
    first = empty_file()
    os.chmod(first, 0o644)
    os.unlink(first)
    second = empty_file()
    assert os.path.getsize(second) == 0 and stat.S_IMODE(os.stat(second).st_mode) == 0o444
    assert empty_file() == second


def test_engines_that_end_without_exit_handlers_leave_no_empty_file_behind():
    """An interrupted `evolve run` leaves by os._exit and a killed one by SIGKILL: neither runs atexit handlers, and
    each left a /tmp/evolve-empty-* file (a red team counted 32). Every engine of a user now shares one file."""
    import subprocess
    import sys
    import tempfile

    code = "import os\nfrom sandboxes.host_config import empty_file\nprint(empty_file())\nos._exit(0)\n"
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)  # the folder and file, if new
    before = set(os.listdir(tempfile.gettempdir()))
    made = {subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip()}
    made.add(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.strip())
    # Only empty-file entries count: the other pytest worker makes (and removes) temporary folders of its own here
    new = {name for name in set(os.listdir(tempfile.gettempdir())) - before if "empty" in name}
    assert new == set() and len(made) == 1, (new, made)


@pytest.mark.parametrize("kind", ["process", "docker"])
def test_a_hidden_file_that_vanishes_before_its_mount_costs_the_candidate_nothing(kind, problem, monkeypatch):
    """Found in CI: a pip.conf planted by a test beside this one was listed for hiding, then deleted before the
    jail or the container was made; neither bubblewrap nor runc can make a mount point in the read-only /usr, so
    a known program scored zeros as a crash. Here the first listing names a file that is not there."""
    import sandboxes.docker_lockdown
    import sandboxes.jail

    module = sandboxes.jail if kind == "process" else sandboxes.docker_lockdown
    real, listings = module.hidden_host_files, []
    gone = f"/usr/local/lib/evolve-vanished-{uuid.uuid4().hex[:8]}.conf"

    def listed() -> list[str]:
        listings.append(gone)
        return [gone] if len(listings) == 1 else real()

    box = hiding_sandbox(kind, 1)
    try:
        monkeypatch.setattr(module, "hidden_host_files", listed)  # after the jail's probe, which lists too
        assert_known_vectors(box, problem)
    finally:
        box.close()
    assert len(listings) >= 2 and not os.path.lexists(gone)
    if kind == "docker":  # the refused container was removed, not left behind as a created one
        import docker

        mine = {"label": f"vpo-evolve.owner={sandboxes.docker_lockdown.OWNER}"}
        assert docker.from_env().containers.list(all=True, filters=mine) == []


@pytest.mark.parametrize("kind", ["process", "docker"])
def test_a_jail_or_container_refused_twice_is_the_sandboxs_failure_naming_the_mount(kind, problem, monkeypatch):
    """A host file listed but gone every time: made twice, refused twice. That is no candidate's crash, so it is
    raised as the sandbox's refusal (the loop counts it as an incident and stops on a streak); and the sandbox
    still scores known programs exactly once the listing is true again."""
    import sandboxes.docker_lockdown
    import sandboxes.jail
    from sandboxes.sandbox import SandboxRefused

    module = sandboxes.jail if kind == "process" else sandboxes.docker_lockdown
    real = module.hidden_host_files
    gone = f"/usr/local/lib/evolve-vanished-{uuid.uuid4().hex[:8]}.conf"
    box = hiding_sandbox(kind, 1)
    try:
        monkeypatch.setattr(module, "hidden_host_files", lambda: [gone])
        with pytest.raises(SandboxRefused, match=f"{gone}.*[Rr]ead-only file system"):
            box.evaluate(problem, "def solve(x):\n    return x * x\n")
        monkeypatch.setattr(module, "hidden_host_files", real)
        assert_known_vectors(box, problem)
    finally:
        box.close()
