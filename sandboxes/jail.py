"""A minimal filesystem view for the process sandbox, made by bubblewrap (Debian's `bubblewrap`, Flatpak's sandbox).

The candidate sees `/usr` read-only, the Python runtime read-only at fixed jail paths (`/opt/python`, and a
virtual environment rebuilt at `/opt/venv`), its job's files read-only in a size-capped tmpfs at `/work`, the
problem's `data/` read-only at `/data`, a private `/tmp`, `/dev/shm`, `/dev` and `/proc`, and nothing else: no
problem folder, no archive, no home, no other process. It runs in fresh pid, network, IPC, UTS and cgroup
namespaces; when the pid namespace's first process dies the kernel kills every process left in it, so nothing
outlives a job.

Why the runtime is moved rather than bound at its own path: an interpreter may live anywhere (a `.venv` in a
checkout under `/work`, a virtual environment under `/tmp`, pyenv in a home folder), and bound at its own path
it would be hidden by the jail's scratch mounts, or hide them. No host path appears in the jail but /usr (less
its local configuration, `HOST_CONFIG_UNDER_USR`), /bin, /lib*, /sbin and two files of /etc; whatever the layout,
the same jail paths hold the same things.

As root no user namespace is made: the harness starts as root holding only CAP_SETUID/CAP_SETGID and drops to
the slot's uid before it reads the job. Without root a user namespace is needed (the kernel must allow them).
Either way the candidate itself can make none (sandboxes/seccomp.py). We use a kept tool rather than our own
mounts: bubblewrap checks every call it makes and exits non-zero on any failure, so a sandbox that cannot be
made is refused, never run weaker.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sandboxes.host_config import empty_file, hidden_host_config, hidden_host_files
from sandboxes.jail_watch import JailPipes
from sandboxes.seccomp import SocketRule, memfd_holding, seccomp_fd

WORK, DATA = "/work", "/data"
PYTHON_INSIDE, VENV_INSIDE = "/opt/python", "/opt/venv"
WORK_BYTES = 256 << 20  # what a candidate may write under /work in all, like the Docker sandbox's tmpfs
SCRATCH_BYTES = {"/tmp": 256 << 20, "/dev/shm": 64 << 20, WORK: WORK_BYTES}  # the Docker sandbox's sizes
# Inodes per scratch mount (and per folder of a program), set by the jail's init: each costs kernel memory that
# neither the tmpfs size nor RLIMIT_AS counts (about 1.5 KiB with its dentry); these cap it near 50 MiB a job.
SCRATCH_INODES = {"/tmp": 16384, "/dev/shm": 1024, WORK: 8192}
FOLDER_INODES = 4096
DEVICES = ("null", "zero", "full", "random", "urandom")  # bound one by one: see Jail.argv
INIT_SOURCE = (Path(__file__).parent / "jail_init.py").read_text()
INSTALLATION_FOLDERS = ("bin", "include", "lib", "lib64", "share")  # what a Python installation or venv is made of
# An installation prefix's configuration (npm's etc/npmrc, conda's etc/conda): never needed to run, where tokens live.
PREFIX_CONFIG = "etc"


@dataclass(frozen=True)
class Runtime:
    """The interpreter as the jail shows it: read-only binds from host paths to fixed jail paths."""

    executable: str  # the interpreter's path inside the jail
    binds: tuple[tuple[str, str], ...]  # (host path, jail path), read-only, in order
    links: tuple[tuple[str, str], ...] = ()  # (link target, jail path): the environment's own relative links
    venv_cfg: str | None = None  # pyvenv.cfg of the rebuilt virtual environment, pointing at the moved base
    library_path: str | None = None  # LD_LIBRARY_PATH for a shared libpython found through an absolute RUNPATH


def _venv_cfg(host_cfg: Path, home: str) -> str:
    """The environment's pyvenv.cfg with `home` at the jail's base interpreter; no host path is kept."""
    keep = {"include-system-site-packages": "false", "version": ""}
    if host_cfg.is_file():
        for line in host_cfg.read_text().splitlines():
            key, eq, value = line.partition("=")
            if eq and key.strip().lower() in keep:
                keep[key.strip().lower()] = value.strip()
    return f"home = {home}\n" + "".join(f"{k} = {v}\n" for k, v in keep.items() if v)


def base_interpreter() -> Path:
    """The base installation's interpreter, also when run from a virtual environment made with `--copies`.

    A copy in the environment's `bin` is not under sys.base_prefix: taken for the installation, the environment
    itself was bound at /opt/python, where its copied interpreter read its pyvenv.cfg, whose `home` names a host
    folder the jail has not got, and ran without its standard library (the jail's probe failed and the sandbox
    fell back to WEAK; Docker took Debian's standard library under /usr instead).
    """
    base = Path(getattr(sys, "_base_executable", "") or sys.executable)
    return (base if base.is_file() else Path(sys.executable)).resolve()


def _add_folders(
    host: Path, inside: str, skip: tuple[str, ...], binds: list[tuple[str, str]], links: list[tuple[str, str]]
) -> None:
    """Bind each folder of `host` at its place under `inside`, and remake its relative links to folders (lib64 ->
    lib); the files at its top, links to files, and its `etc` stay out. pip reads `{sys.prefix}/pip.conf`, where an
    installation or environment of one's own (pyenv, conda, a venv) keeps an index URL with its token; conda keeps
    `.condarc` there. Bound whole, the installation showed them to every candidate at /opt/python/pip.conf, in
    both sandboxes; a pip.conf that was a relative link to a file in `share` was remade, and pip read it.

    A folder this engine may cross but not list (an ACL granting a user `--x` only) gives the folders an
    installation or environment is made of."""
    try:
        entries = sorted(host.iterdir())
    except PermissionError:
        entries = [host / name for name in INSTALLATION_FOLDERS]
    for entry in entries:
        target = f"{inside}/{entry.name}"
        if entry.name in skip or entry.name == PREFIX_CONFIG:
            continue
        if entry.is_symlink():
            if not os.path.isabs(os.readlink(entry)) and entry.is_dir():
                links.append((os.readlink(entry), target))
        elif entry.is_dir():
            binds.append((str(entry), target))


def jail_runtime() -> Runtime:
    """Where this engine's interpreter comes from, and where the jail puts it.

    The installation (sys.base_prefix, or the folder above the interpreter's) is bound at PYTHON_INSIDE, folder
    by folder (not the configuration files at its top, nor `envs`), unless it is under /usr, which comes in
    whole. A virtual environment is rebuilt at VENV_INSIDE from its parts: its folders but `bin`, a pyvenv.cfg
    whose `home` is the moved base, and the real interpreter as `bin/python` (the environment's own `bin/python`
    is a link to an absolute host path that the jail does not have).
    """
    executable = base_interpreter()
    base = Path(sys.base_prefix).resolve()
    if not executable.is_relative_to(base):
        base = executable.parent.parent
    binds: list[tuple[str, str]] = []
    links: list[tuple[str, str]] = []
    library_path = None
    if base.is_relative_to("/usr"):
        inside = executable
    else:
        inside = Path(PYTHON_INSIDE) / executable.relative_to(base)
        _add_folders(base, PYTHON_INSIDE, ("envs",), binds, links)  # pyenv-virtualenv's and conda's other environments
        if executable.parent == base:  # an interpreter at the installation's top is a file there too
            binds.append((str(executable), str(inside)))
        if any((base / "lib").glob("libpython*.so*")):  # its RUNPATH names the host path, absent in the jail
            library_path = f"{PYTHON_INSIDE}/lib"
    venv = Path(sys.prefix).resolve()
    if sys.prefix == sys.base_prefix or venv == base:
        return Runtime(str(inside), tuple(binds), tuple(links), library_path=library_path)
    _add_folders(venv, VENV_INSIDE, ("bin",), binds, links)
    binds.append((str(executable), f"{VENV_INSIDE}/bin/python3"))
    cfg = _venv_cfg(venv / "pyvenv.cfg", str(inside.parent))
    return Runtime(f"{VENV_INSIDE}/bin/python3", tuple(binds), tuple(links), cfg, library_path)


@dataclass
class JobFiles:
    """Descriptors bubblewrap reads once as it starts (the seccomp filter, the rebuilt pyvenv.cfg) or writes to
    (its info, the init's words): the caller passes them to the child and closes them once it has started. The
    read ends of `pipes` stay with the caller (sandboxes/jail_watch.py)."""

    seccomp: int | None = None
    venv_cfg: int | None = None
    # A native problem's toolchains outside /usr, bound read-only: (host folder, jail path); sandboxes/toolchain.py
    tools: tuple[tuple[str, str], ...] = ()
    pipes: JailPipes | None = None
    fds: tuple[int, ...] = field(default=(), init=False)

    def __post_init__(self) -> None:
        own = tuple(fd for fd in (self.seccomp, self.venv_cfg) if fd is not None)
        self.fds = own + (self.pipes.write_ends if self.pipes is not None else ())

    def close(self) -> None:
        for fd in (self.seccomp, self.venv_cfg):
            if fd is not None:
                os.close(fd)
        if self.pipes is not None:
            self.pipes.close_write_ends()


def work_binds(host: str, inside: str) -> list[str]:
    """The job's files under `host`, each bound read-only at its place under `inside`, and each of the program's
    folders a tmpfs of its own, sticky and writable by all like /work: a build writes its outputs beside its
    sources (`cc -c lib/x.c -o lib/x.o`), while no job file can be changed, and neither it nor a folder
    holding it can be renamed, replaced or deleted, since each is a mount point (EBUSY).

    A folder made with `--dir` would do for root's jail (it is root's, in sticky /work), but without root
    bubblewrap's user namespace maps one uid only, so the folder belonged to the candidate, who renamed `lib`
    away and made a `lib/offset.h` of its own. (A folder bound whole was read-only, so such a build failed.)
    Each folder's tmpfs has /work's size: without a memory cgroup, scratch grows by WORK_BYTES per folder."""
    args: list[str] = []
    for name in sorted(os.listdir(host)):
        path, target = os.path.join(host, name), f"{inside}/{name}"
        if os.path.isdir(path) and not os.path.islink(path):
            args += ["--perms", "01777", "--size", str(WORK_BYTES), "--tmpfs", target, *work_binds(path, target)]
        else:
            args += ["--ro-bind", path, target]
    return args


def _parents(path: str, made: set[str]) -> list[str]:
    """bubblewrap would make missing parents 0700, which the slot's uid could not cross: make them 0755."""
    args: list[str] = []
    for parent in map(str, reversed(Path(path).parents[:-1])):
        if parent not in made:
            made.add(parent)
            args += ["--perms", "0755", "--dir", parent]
    return args


@dataclass(frozen=True)
class Jail:
    """How to start the interpreter under bubblewrap; `argv` gives the full command line for one job."""

    bwrap: str
    as_root: bool
    runtime: Runtime

    def job_files(self, sockets: SocketRule, tools: tuple[tuple[str, str], ...] = ()) -> JobFiles:
        cfg = self.runtime.venv_cfg
        venv_cfg = None if cfg is None else memfd_holding("evolve-pyvenv", cfg.encode())
        return JobFiles(seccomp_fd(sockets), venv_cfg, tools, JailPipes.make())

    def argv(
        self, workdir: str, data_dir: Path | None, python_args: list[str], files: JobFiles, keep_fd: int = -1
    ) -> list[str]:
        """bubblewrap's command line running the jail's init (sandboxes/jail_init.py) as the pid namespace's first
        process, which runs the jail's interpreter with `python_args` in /work, passing it descriptor `keep_fd`.

        Without root one user namespace, not bubblewrap's two: `--dev` (its devpts wants uid 0 mapped) and
        `--disable-userns` each make it nest a second one, and the init's CAP_SYS_ADMIN in the inner one could not
        remount the scratch mounts the outer one owns. So the devices are bound one by one (no pseudo-terminals),
        and user namespaces stay refused to the candidate by the seccomp filter alone (sandboxes/seccomp.py)."""
        assert files.pipes is not None, "a jailed job needs its pipes (Jail.job_files)"
        namespaces = ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        if not self.as_root:  # our own user namespace
            namespaces[:0] = ["--unshare-user"]
        args = [self.bwrap, *namespaces, "--die-with-parent", "--new-session", "--as-pid-1"]
        args += ["--info-fd", str(files.pipes.info_w), "--ro-bind", "/usr", "/usr"]
        for hidden in hidden_host_config():
            args += ["--perms", "0555", "--size", "4096", "--tmpfs", hidden, "--remount-ro", hidden]
        for hidden in hidden_host_files():
            args += ["--ro-bind", empty_file(), hidden]
        for name in ("bin", "lib", "lib64", "sbin"):
            host = Path("/") / name
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{name}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{name}"]
        made: set[str] = set()
        for host, inside in files.tools:  # first: a parent made by a bind below would be 0700 (/etc)
            args += [*_parents(inside, made), "--ro-bind", host, inside]
        for extra in ("/etc/ld.so.cache", "/etc/localtime"):
            if os.path.exists(extra):
                args += ["--ro-bind", extra, extra]
        args += ["--proc", "/proc", "--perms", "0755", "--dir", "/dev"]
        for device in DEVICES:
            args += ["--dev-bind", f"/dev/{device}", f"/dev/{device}"]
        for number, name in enumerate(("stdin", "stdout", "stderr")):
            args += ["--symlink", f"/proc/self/fd/{number}", f"/dev/{name}"]
        args += ["--symlink", "/proc/self/fd", "/dev/fd"]
        if data_dir is not None:
            args += ["--ro-bind", str(data_dir), DATA]
        runtime = self.runtime
        for host, inside in runtime.binds:
            args += [*_parents(inside, made), "--ro-bind", host, inside]
        for target, inside in runtime.links:
            args += ["--symlink", target, inside]
        if files.venv_cfg is not None:
            args += ["--perms", "0644", "--ro-bind-data", str(files.venv_cfg), f"{VENV_INSIDE}/pyvenv.cfg"]
        # The root bubblewrap builds on is a tmpfs without a size, writable in a user namespace: read-only from
        # here on, with submounts; the scratch mounts come after it. (Its folders are 0755: the slot's uid, not
        # root, must cross them.)
        for mount in SCRATCH_BYTES:
            args += ["--perms", "0755", "--dir", mount]
        args += ["--remount-ro", "/"]
        # Private, size-capped scratch: /work is a tmpfs (a candidate cannot fill the host's disk) into which
        # the files the engine wrote for the job are bound read-only.
        for mount, size in SCRATCH_BYTES.items():
            args += ["--perms", "01777", "--size", str(size), "--tmpfs", mount]
        folders = work_binds(workdir, WORK)
        args += folders
        if runtime.library_path is not None:
            args += ["--setenv", "LD_LIBRARY_PATH", runtime.library_path]
        # The init's only: CAP_SYS_ADMIN to bound the scratch mounts' inodes, CAP_SETPCAP to drop the bounding set;
        # as root also what the harness keeps to become the slot's uid (as root bubblewrap would keep every one).
        # One capability per --cap-add: bubblewrap reads a comma-separated list as its first name alone.
        caps = ["CAP_SYS_ADMIN", "CAP_SETPCAP", *(["CAP_SETUID", "CAP_SETGID"] if self.as_root else [])]
        args += ["--cap-drop", "ALL"] + [arg for cap in caps for arg in ("--cap-add", cap)]
        if files.seccomp is not None:
            args += ["--seccomp", str(files.seccomp)]
        exe = runtime.executable
        init = [exe, "-I", "-S", "-c", INIT_SOURCE, str(files.pipes.status_w), str(keep_fd), scratch_inodes(folders)]
        return [*args, "--chdir", WORK, "--", *init, "--", exe, *python_args]


def scratch_inodes(folder_args: list[str]) -> str:
    """The init's MOUNTS argument: each scratch mount and each program folder's tmpfs (from `work_binds`'
    arguments) with its inode limit."""
    limits = dict(SCRATCH_INODES)
    for flag, target in itertools.pairwise(folder_args):
        if flag == "--tmpfs":
            limits[target] = FOLDER_INODES
    return ",".join(f"{path}={inodes}" for path, inodes in limits.items())


PROBE = """import os, sys
assert os.getpid() < 10, "no pid namespace"
assert not os.path.exists(HIDDEN), "the host's temp folder is visible"
assert sys.prefix in ("/opt/venv", sys.base_prefix), sys.prefix
assert os.statvfs("/work").f_blocks * os.statvfs("/work").f_frsize <= WORK_BYTES, "/work is not the jail's scratch"
assert not os.access("/", os.W_OK), "the jail's root is writable"
assert os.statvfs("/tmp").f_files <= TMP_INODES, "the scratch mounts' inodes are not bounded"
assert os.getpid() == 2, "the jail's init is not the first process"
"""


def _diagnosis(stderr: str) -> str:
    """bubblewrap's (or the probe's) own words, and a hint only where they point at user namespaces."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = "; ".join(lines[-2:]) or "no message"
    if any(("namespace" in line or "uid map" in line or "setting up uid" in line) for line in lines):
        return (
            f"bubblewrap cannot make the sandbox here ({said}); user namespaces look disabled "
            "(sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone or an AppArmor restriction)"
        )
    return f"bubblewrap cannot make the sandbox here ({said})"


def find_jail(runtime: Runtime | None = None) -> tuple[Jail | None, str]:
    """A working jail for `runtime` (this interpreter's by default), or None and why not (one line naming the
    true cause and, where known, the fix)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, "bubblewrap is not installed (apt-get install bubblewrap)"
    jail = Jail(bwrap, os.geteuid() == 0, runtime or jail_runtime())
    files = jail.job_files(SocketRule.NONE)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            probe = PROBE.replace("HIDDEN", repr(workdir)).replace("WORK_BYTES", str(WORK_BYTES))
            probe = probe.replace("TMP_INODES", str(SCRATCH_INODES["/tmp"]))
            out = subprocess.run(
                jail.argv(workdir, None, ["-I", "-c", probe], files),
                capture_output=True,
                text=True,
                timeout=30,
                pass_fds=files.fds,
            )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"bubblewrap did not start ({exc})"
    finally:
        files.close()
        if files.pipes is not None:
            files.pipes.close_read_ends()
    if out.returncode != 0:
        return None, _diagnosis(out.stderr)
    return jail, ""
