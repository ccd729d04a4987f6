"""A throw-away PostgreSQL cluster: `initdb` in a temporary folder, served on a Unix socket only.

The tests' session-wide fixture and benchmarks.scale_out both start one; it lives here, in the installed
package, because tests and benchmarks import nothing from each other. PostgreSQL refuses to run as root, so
under root the cluster belongs to the `postgres` system user (Debian's package makes it), else to `nobody`.
Each test, or each measured point, gets its own database in the one cluster.
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

ADMIN = "evolve"
PORT = 55432  # names the socket file only: the server listens on no TCP port


def pg_bin(name: str) -> str | None:
    """`pg_ctl`/`initdb` from PATH or Debian's versioned folder (which is not on PATH)."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return candidates[-1] if candidates else None


def _owner() -> pwd.struct_passwd | None:
    """The unprivileged account the server runs as when started by root; None when not root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise RuntimeError("running as root and no `postgres` or `nobody` user to run PostgreSQL as")


@dataclass
class PostgresCluster:
    root: Path
    pg_ctl: str
    owner: pwd.struct_passwd | None
    _names = itertools.count()

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root

    def _run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        extra = {} if self.owner is None else {"user": self.owner.pw_uid, "group": self.owner.pw_gid}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "HOME": str(self.root)}
        return subprocess.run(
            list(args), cwd=self.root, env=env, capture_output=True, text=True, timeout=timeout, **extra
        )

    @classmethod
    def start(cls) -> PostgresCluster:
        """Make and start a cluster; raises RuntimeError saying why when it cannot."""
        initdb, pg_ctl = pg_bin("initdb"), pg_bin("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise RuntimeError("no initdb/pg_ctl found (apt-get install -y postgresql)")
        root = Path(tempfile.mkdtemp(prefix="evpg-"))
        owner = _owner()
        if owner is not None:
            os.chown(root, owner.pw_uid, owner.pw_gid)
        cluster = cls(root, pg_ctl, owner)
        try:
            cluster._make_and_start(initdb)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _make_and_start(self, initdb: str) -> None:
        cluster, root, pg_ctl = self, self.root, self.pg_ctl
        made = cluster._run(initdb, "-D", str(cluster.data), "-U", ADMIN, "--auth=trust", "-E", "UTF8", "--no-sync")
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed: {made.stderr.strip()[-500:]}")
        options = (
            f"-k {root} -p {PORT} -c listen_addresses='' -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=200 -c shared_buffers=32MB"
        )
        started = cluster._run(
            pg_ctl, "-D", str(cluster.data), "-o", options, "-l", str(root / "server.log"), "-w", "-t", "240", "start"
        )
        if started.returncode != 0:
            log = (root / "server.log").read_text()[-800:] if (root / "server.log").exists() else ""
            raise RuntimeError(f"pg_ctl start failed: {started.stderr.strip()[-400:]} {log}")

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://{ADMIN}@/{database}?host={self.socket_dir}&port={PORT}"

    def new_database(self, prefix: str = "t") -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = f"{prefix}_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(
            host=str(self.socket_dir), port=PORT, user=ADMIN, dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
