"""Images for the Docker sandbox: a problem's Dockerfile, `python:3.12-slim`, or a base made without a registry.

The base made here (`evolve sandbox build-base`) is an imported image that holds nothing but empty
directories; the host's `/usr` and Python installation are bind-mounted read-only at run time. It needs no
pull, which is what air-gapped clusters and these machines want.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import io
import re
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from evolve.problem import Problem
from sandboxes.jail import SCRATCH_INODES, VENV_INSIDE, WORK, Runtime, jail_runtime
from sandboxes.toolchain import Toolchain, host_toolchain

SLIM = "python:3.12-slim"
HOST_BASE = "vpo-evolve/base:host-python-v2"  # v2: Python bound at /opt/python
LABEL_PYTHON = "vpo-evolve.python"
LABEL_BINDS = "vpo-evolve.binds"


@dataclass(frozen=True)
class ImageSpec:
    tag: str
    python: str
    binds: dict[str, str] = field(default_factory=dict)  # host path -> container path, read-only


def memory_cap_mb(memory_mb: int) -> int:
    """The container's memory cgroup: RLIMIT_AS bounds each process at `memory_mb`; this bounds the real memory
    of all of them together (candidate, its children, the runner, and what it wrote to the tmpfs scratch)."""
    return memory_mb + 256


def work_mount(problem: Problem) -> str:
    """Options of the /work tmpfs. Docker mounts tmpfs noexec; a native problem runs the program it built there."""
    return f"size=256m,mode=1777,nr_inodes={SCRATCH_INODES[WORK]}" + (",exec" if problem.config.native else "")


PYTHON_INSIDE = "/opt/python"  # never under a scratch folder the runner wipes after each job (/work, /tmp, /dev/shm)


def python_binds(executable: Path, base_prefix: Path) -> tuple[str, dict[str, str]]:
    """(interpreter path inside the container, {host path: container path}) for an installation.

    The installation is bound at PYTHON_INSIDE whatever its host path: were it bound at its own path under
    /tmp, /work, /dev/shm or a home folder, a scratch mount would shadow it or the runner's wipe would walk it
    after every job. A Python under /usr comes in with /usr itself. `executable` is the base interpreter (a
    virtual environment's own, even a copy, would look for its standard library at the host path named in its
    pyvenv.cfg, which the container does not have).
    """
    executable, base = executable.resolve(), base_prefix.resolve()
    if executable.is_relative_to("/usr"):
        return str(executable), {}
    if not executable.is_relative_to(base):
        base = executable.parent.parent
    return f"{PYTHON_INSIDE}/{executable.relative_to(base)}", {str(base): PYTHON_INSIDE}


def _host_python() -> tuple[str, dict[str, str]]:
    """`python_binds` for the Python running this: its base installation, also when run from a virtual
    environment (a venv's interpreter, symlink or copy, is the base one with another sys.prefix)."""
    base_executable = Path(getattr(sys, "_base_executable", "") or sys.executable)
    return python_binds(base_executable if base_executable.is_file() else Path(sys.executable), Path(sys.base_prefix))


def host_binds() -> tuple[str, dict[str, str]]:
    """(interpreter inside, every read-only bind) of the base image made here: the host's /usr and Python."""
    python, installation = _host_python()
    return python, {"/usr": "/usr", **installation}


def host_spec(runtime: Runtime | None = None) -> ImageSpec:
    """The base image made here as this engine runs it: the host's /usr and this engine's own Python.

    The interpreter is laid out as the process sandbox's jail lays it out (sandboxes/jail.py: the installation
    at PYTHON_INSIDE, a virtual environment rebuilt at /opt/venv), so a candidate imports what it imports
    there. Before, the container ran the base installation named in the image's labels: a virtual
    environment's packages were missing (its numpy, say) and the base's were there instead, and the labels
    named whichever Python last ran `evolve sandbox build-base` on the machine, not this engine's.
    """
    runtime = runtime or jail_runtime()
    binds = {"/usr": "/usr", **dict(runtime.binds)}
    if runtime.venv_cfg is not None:
        binds[_cfg_file(runtime.venv_cfg)] = f"{VENV_INSIDE}/pyvenv.cfg"
    return ImageSpec(HOST_BASE, runtime.executable, binds)


@functools.cache
def _cfg_file(text: str) -> str:
    """A host file holding `text` for as long as this engine lives (a bind's source must be a host path)."""
    folder = tempfile.mkdtemp(prefix="evolve-pyvenv-")
    atexit.register(shutil.rmtree, folder, True)
    path = Path(folder) / "pyvenv.cfg"
    path.write_text(text)
    path.chmod(0o444)
    return str(path)


def runtime_env(spec: ImageSpec) -> dict[str, str]:
    """Environment the container needs for the image's Python: a Python bound at PYTHON_INSIDE loads its own
    shared libraries (libpython), which its host path, written into the binary, no longer reaches; without
    this the loader took the system's libpython of another patch release, or none."""
    if any(inside == PYTHON_INSIDE or inside.startswith(f"{PYTHON_INSIDE}/") for inside in spec.binds.values()):
        return {"LD_LIBRARY_PATH": f"{PYTHON_INSIDE}/lib"}  # bound whole (labels) or folder by folder (jail's)
    return {}


def image_toolchain(spec: ImageSpec, problem: Problem) -> Toolchain:
    """A native problem's tools in this image: the host's (bound like its /usr) when the image takes /usr from
    the host, else the commands as written (a problem's Dockerfile installs its own toolchain)."""
    return host_toolchain(problem) if spec.binds.get("/usr") == "/usr" else Toolchain()


def build_base(client: Any) -> ImageSpec:
    """Import an empty root with symlinks into /usr; the host's Python comes in by read-only binds."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        # /sbin stays a real directory: Docker mounts its init at /sbin/docker-init.
        for d in ("work", "tmp", "dev", "proc", "sys", "etc", "usr", "sbin", "data", "opt/evolve", "opt/python"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for link in ("bin", "lib", "lib64"):
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, f"usr/{link}"
            tar.addfile(info)
        passwd = b"root:x:0:0::/:/bin/false\nsandbox:x:1000:1000::/work:/bin/false\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
    python, all_binds = host_binds()
    repository, _, tag = HOST_BASE.rpartition(":")
    changes = [_labels(python, all_binds)]
    client.api.import_image_from_data(buf.getvalue(), repository=repository, tag=tag, changes=changes)
    return host_spec()  # as this engine runs it; the labels record who built the image (read back by `spec_of`)


def _labels(python: str, binds: dict[str, str]) -> str:
    """The LABEL line of the base image. Paths are percent-encoded: a `"`, `\\` or newline in a path (a user's
    home folder may hold one) ended the Dockerfile string early and failed the import; `,` and `=` would split a
    bind in two when read back."""
    pairs = ",".join(f"{quote(host, safe='/')}={quote(inside, safe='/')}" for host, inside in binds.items())
    return f'LABEL {LABEL_PYTHON}="{quote(python, safe="/")}" {LABEL_BINDS}="{pairs}"'


def spec_of(client: Any, tag: str) -> ImageSpec:
    labels = client.images.get(tag).labels or {}
    pairs = [b.partition("=") for b in labels.get(LABEL_BINDS, "").split(",") if b]
    binds = {unquote(host): unquote(inside or host) for host, _, inside in pairs}
    return ImageSpec(tag, unquote(labels.get(LABEL_PYTHON, "python3")), binds)


def _has(client: Any, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def image_name(problem_name: str) -> str:
    """The problem's name as Docker takes it in an image name: lowercase letters and digits joined by '-'.

    A problem's name is free text, and `evolve init "my problem"` names it after its folder: lowercased alone,
    `vpo-evolve/problem-my problem:…` was refused by Docker, so no evaluation of such a problem could start. A
    name that had to change keeps a hash of itself, so two problems ("a b", "a-b") never share an image."""
    name = "-".join(re.findall(r"[a-z0-9]+", problem_name.lower())) or "unnamed"
    if name == problem_name.lower():  # a name Docker took as it was keeps its image
        return name
    return f"{name}-{hashlib.sha256(problem_name.encode()).hexdigest()[:8]}"


def image_for(client: Any, problem: Problem, base: str | None = None) -> ImageSpec:
    """The problem's own image (built once, tagged by a hash of its Dockerfile), else a base image."""
    dockerfile = problem.root / "Dockerfile"
    if dockerfile.is_file():
        digest = hashlib.sha256(dockerfile.read_bytes()).hexdigest()[:12]
        tag = f"vpo-evolve/problem-{image_name(problem.name)}:{digest}"
        if not _has(client, tag):
            client.images.build(path=str(problem.root), tag=tag, rm=True)
        return ImageSpec(tag, "python3")
    if base:
        return spec_of(client, base)
    if _has(client, SLIM) and not problem.config.native:  # slim has no compiler; the host base has the host's
        return ImageSpec(SLIM, "python3")
    if not _has(client, HOST_BASE):
        build_base(client)
    return host_spec()
