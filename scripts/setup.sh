#!/usr/bin/env bash
# Installs vpo-evolve and what its tests and demo need on a fresh machine. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# torch first: on CPU machines the pinned 2.13.0 CPU build; a machine that already has torch (CUDA) keeps it.
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q torch==2.13.0
$PY -m pip install -q -e '.[model,embedded,dev,postgres,ray]'

if [ "$(id -u)" = 0 ]; then
  # The process sandbox runs candidates as unprivileged uids; they must be able to reach the interpreter.
  $PY - <<'PYEOF'
import os, stat, sys
from pathlib import Path
for path in Path(sys.base_prefix).resolve().parents:
    if not os.stat(path).st_mode & stat.S_IXOTH:
        os.chmod(path, os.stat(path).st_mode | stat.S_IXOTH)
        print(f"setup: chmod o+x {path} (so sandboxed uids can run {sys.executable})")
PYEOF
  # PostgreSQL binaries for the tests' throw-away clusters (they run initdb/pg_ctl themselves; no service needed).
  if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) \
      || echo "setup: could not install postgresql; PostgreSQL tests will be skipped (fail in CI)"
  fi
  # Docker: start a daemon if none answers (installing Debian's docker.io where it is missing).
  if ! docker info >/dev/null 2>&1; then
    if ! command -v dockerd >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null) \
        || echo "setup: could not install docker.io; Docker tests will be skipped"
    fi
    if command -v dockerd >/dev/null 2>&1; then
      (setsid dockerd >/tmp/dockerd.log 2>&1 &)
      for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    fi
  fi
fi
if docker info >/dev/null 2>&1; then
  evolve sandbox build-base  # no registry needed; production machines may `docker pull python:3.12-slim` instead
else
  echo "setup: no Docker daemon; the process sandbox will be used and Docker tests skipped"
fi
echo "setup: done"
