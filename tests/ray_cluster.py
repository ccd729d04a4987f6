"""A two-node Ray cluster on this machine for tests: a head and a second node, each started with `ray start`.

Both nodes get few CPUs and no dashboard; every process of the second node can be killed at once (its raylet
and all the raylet's descendants), which is how the tests lose a node mid-run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

NETNS = f"evray-{os.getpid()}"


def in_netns(cmd: list[str]) -> list[str]:
    """Run `cmd` in this test session's own network namespace, where loopback is the only interface.

    Ray rewrites 127.0.0.1 in a cluster address into the machine's outward address; in a namespace that has
    only `lo`, that address is 127.0.0.1 itself, so no Ray traffic ever targets anything but loopback.
    """
    return ["ip", "netns", "exec", NETNS, *cmd]


def make_netns() -> None:
    if os.geteuid() != 0:
        raise RuntimeError("needs root to make a loopback-only network namespace (ip netns add)")
    subprocess.run(["ip", "netns", "add", NETNS], check=True, capture_output=True)
    subprocess.run(in_netns(["ip", "link", "set", "lo", "up"]), check=True, capture_output=True)


def drop_netns() -> None:
    subprocess.run(["ip", "netns", "delete", NETNS], capture_output=True)


def ray_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", RAY_DEDUP_LOGS="0")
    here = str(Path(__file__).resolve().parents[1])  # the actors import this checkout's sandboxes/ and evolve/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _raylets() -> set[int]:
    out = subprocess.run(["pgrep", "-f", "ray/core/src/ray/raylet/raylet"], capture_output=True, text=True)
    return {int(p) for p in out.stdout.split()}


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        p, pp = (int(x) for x in line.split())
        children.setdefault(pp, []).append(p)
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


@dataclass
class RayCluster:
    temp: Path
    address: str
    head_raylet: int
    second_raylet: int | None = None
    pids: set[int] = field(default_factory=set)

    @classmethod
    def start(cls, cpus: int = 2, timeout: float = 240, attempts: int = 3) -> RayCluster:
        """Start a head node. Ray gives a raylet a fixed 30 s to register, which a loaded machine can miss,
        so a failed start is cleaned up and tried again."""
        error = ""
        for _ in range(attempts):
            temp = Path(tempfile.mkdtemp(prefix="evray-"))
            port = _free_port()
            before = _raylets()
            head = subprocess.run(
                in_netns(["ray", "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                 f"--num-cpus={cpus}", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}"]),
                env=ray_env(), capture_output=True, text=True, timeout=timeout,
            )  # fmt: skip
            new = _raylets() - before
            cluster = cls(temp, f"127.0.0.1:{port}", next(iter(new)) if len(new) == 1 else -1)
            if head.returncode == 0 and len(new) == 1:
                return cluster
            error = (head.stderr or head.stdout).strip()[-600:]
            cluster.stop()
        raise RuntimeError(f"ray start --head failed {attempts} times: {error}")

    def add_node(self, cpus: int = 2, timeout: float = 240, attempts: int = 3) -> None:
        error = ""
        for _ in range(attempts):
            before = _raylets()
            node = subprocess.run(
                in_netns(["ray", "start", f"--address={self.address}", "--node-ip-address=127.0.0.1",
                 f"--num-cpus={cpus}", "--disable-usage-stats"]),
                env=ray_env(), capture_output=True, text=True, timeout=timeout,
            )  # fmt: skip
            new = _raylets() - before
            if node.returncode == 0 and len(new) == 1:
                self.second_raylet = new.pop()
                return
            error = (node.stderr or node.stdout).strip()[-600:]
            for raylet in new:
                for pid in _descendants(raylet):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        raise RuntimeError(f"ray start --address failed {attempts} times: {error}")

    def kill_second_node(self) -> list[int]:
        """SIGKILL the second node's raylet and every process under it (its agents and actor workers); their pids."""
        assert self.second_raylet is not None
        victims = _descendants(self.second_raylet)
        for pid in reversed(victims):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.second_raylet = None
        return victims

    def stop(self) -> None:
        """Kill this cluster's processes only (never `ray stop`, which would end every Ray on the machine)."""
        session = str(self.temp)
        out = subprocess.run(["pgrep", "-f", session], capture_output=True, text=True).stdout.split()
        pids = {int(p) for p in out}
        for raylet in (self.head_raylet, self.second_raylet):
            if raylet is not None and raylet > 0:
                pids.update(_descendants(raylet))
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        shutil.rmtree(self.temp, ignore_errors=True)
