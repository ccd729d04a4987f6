"""What a sandbox container may do: the arguments every warm container is created with.

Kept apart from the pool (docker_pool.py) and the container's lifecycle (warm_container.py) so the whole
lockdown reads in one place: no network, a read-only root with tmpfs scratch, a memory cgroup without swap,
pid and CPU limits, every capability dropped but the few the runner needs, no-new-privileges, no logs, and
read-only mounts of the runner, the problem's data and the image's toolchain. The labels name the engine that
owns the container (host, pid and pid namespace), so a later engine can tell its own orphans from containers of
engines it cannot see.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from evolve.problem import Problem
from sandboxes.docker_images import ImageSpec, image_toolchain, memory_cap_mb, runtime_env, work_mount
from sandboxes.host_config import empty_file, hidden_host_config, hidden_host_files
from sandboxes.jail import SCRATCH_INODES

SANDBOX_DIR = Path(__file__).resolve().parent  # bound read-only at /opt/evolve: the runner and its helpers
OWNER = f"{socket.gethostname()}:{os.getpid()}"
# OWNER's pid namespace: an engine in another (a container sharing the daemon and hostname) has pids we cannot see
PID_NAMESPACE = str(os.stat("/proc/self/ns/pid").st_ino)


def container_settings(spec: ImageSpec, problem: Problem) -> dict[str, Any]:
    """The keyword arguments of `client.containers.create` for one warm container of `problem` on `spec`."""
    from docker.types import LogConfig, Mount, Ulimit

    limits = problem.config.sandbox_limits  # a build and its program, one after the other
    # (host, inside) pairs, not a dict keyed by host: one host folder may be needed at two places (the engine's
    # Python at /opt/python and, when a build starts it, at /opt/toolchain/0), and keyed by host the last one
    # dropped the first: no container could start its runner.
    binds = [*spec.binds.items(), *image_toolchain(spec, problem).binds]
    volumes = [(str(SANDBOX_DIR), "/opt/evolve"), *binds]
    # The host's /usr brings its local configuration along: an empty read-only folder goes over it, and an
    # empty file over its pip.conf (host_config.HOST_FILES_UNDER_USR).
    hidden: dict[str, str] = {}
    if ("/usr", "/usr") in binds:
        hidden = {path: "ro,size=4k" for path in hidden_host_config()}
        volumes += [(empty_file(), path) for path in hidden_host_files()]
    env = {"PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "HOME": "/work"}
    env.update(runtime_env(spec))
    if problem.data_dir is not None:
        volumes.append((str(problem.data_dir), "/data"))
        env["EVOLVE_DATA_DIR"] = "/data"
    return {
        "image": spec.tag,
        "command": [spec.python, "-u", "-I", "-B", "/opt/evolve/container_runner.py"],
        "stdin_open": True,
        "init": True,
        "network_mode": "none",
        "read_only": True,
        "tmpfs": {
            "/work": work_mount(problem),
            "/tmp": f"size=256m,mode=1777,nr_inodes={SCRATCH_INODES['/tmp']}",
            "/dev/shm": f"size=64m,nr_inodes={SCRATCH_INODES['/dev/shm']}",
            **hidden,
        },
        "mem_limit": f"{memory_cap_mb(limits.memory_mb)}m",
        "memswap_limit": f"{memory_cap_mb(limits.memory_mb)}m",  # the same: no swap to spill into
        "nano_cpus": 1_000_000_000,
        "pids_limit": limits.max_processes + 16,
        "cap_drop": ["ALL"],
        "cap_add": ["SETUID", "SETGID", "KILL", "DAC_OVERRIDE", "FOWNER", "CHOWN"],
        "security_opt": ["no-new-privileges"],
        "ulimits": [Ulimit(name="core", soft=0, hard=0)],
        "log_config": LogConfig(type="none"),
        # Mounts rather than `volumes`: Docker parses a volume as HOST:CONTAINER:MODE, so a host path holding
        # a colon (a problem folder "a:b", a checkout under it) was refused as an invalid specification.
        "mounts": [Mount(inside, host, type="bind", read_only=True) for host, inside in volumes],
        "environment": env,
        "labels": {"vpo-evolve.owner": OWNER, "vpo-evolve.pidns": PID_NAMESPACE},
    }
