#!/usr/bin/env bash
# Runs the sandbox suites as an unprivileged user (made here if missing), so that containment is proven
# without root too. Needs root to set up; run by .ci/run after the root pass. Usage: [EVOLVE_TEST_USER=evolve-ci] scripts/test-as-user.sh [PYTEST ARGS]
set -euo pipefail
cd "$(dirname "$0")/.."
USER_NAME=${EVOLVE_TEST_USER:-evolve-ci}
PY=$(command -v "${PYTHON:-python3}")
if [ "$(id -u)" != 0 ]; then echo "test-as-user: run me as root" >&2; exit 2; fi
# A system uid (below 1000): clear of the Docker sandbox's uid 1000 and the process sandbox's 61000+.
id "$USER_NAME" >/dev/null 2>&1 || useradd --system --create-home --shell /bin/bash "$USER_NAME"
# Docker's socket belongs to the docker group: the unprivileged engine talks to the daemon through it.
getent group docker >/dev/null && usermod -aG docker "$USER_NAME"
# The user must reach the interpreter and this checkout. Where a parent folder (say /root) is closed to
# others, grant traversal to this one user only (an ACL), rather than opening the folder to every uid.
grant() {
  local path
  for path in "$@"; do
    while [ "$path" != / ]; do
      path=$(dirname "$path")
      if ! runuser -u "$USER_NAME" -- test -x "$path"; then
        command -v setfacl >/dev/null || { echo "test-as-user: setfacl missing (apt-get install acl)" >&2; exit 2; }
        setfacl -m "u:$USER_NAME:x" "$path"
      fi
    done
  done
}
grant "$("$PY" -c 'import sys, os; print(os.path.realpath(sys.base_prefix))')/lib" "$(readlink -f "$PY")" "$PWD/x"
HOME_DIR=$(getent passwd "$USER_NAME" | cut -d: -f6)
# tests/test_jail_layouts.py puts a virtual environment in a checkout under a folder named /work: lend the user
# one there (removed afterwards), as only root may write in /work.
made_work=0
[ -d /work ] || { mkdir /work; made_work=1; }
LAYOUT_DIR=$(mktemp -d /work/evolve-layout-test-XXXXXX)
chown "$USER_NAME:" "$LAYOUT_DIR"
cleanup() { rm -rf "$LAYOUT_DIR"; [ "$made_work" = 0 ] || rmdir /work 2>/dev/null || true; }
trap cleanup EXIT
setpriv --reuid="$USER_NAME" --regid="$USER_NAME" --init-groups --reset-env \
  env HOME="$HOME_DIR" PATH="$PATH" PYTHONPATH="$PWD" EVOLVE_REQUIRE_SERVICES="${EVOLVE_REQUIRE_SERVICES:-0}" \
  EVOLVE_LAYOUT_WORK_DIR="$LAYOUT_DIR" \
  "$PY" -m pytest -q -p no:cacheprovider tests/test_sandbox_attacks.py tests/test_host_config_attacks.py \
  tests/test_sandbox_hostile.py tests/test_sandbox_redteam.py tests/test_sandbox_redteam_residue.py \
  tests/test_docker_sandbox.py tests/test_sandbox_memory.py \
  tests/test_jail_layouts.py tests/test_engine_secrets.py tests/test_candidate_limits.py tests/test_weak_refusal.py \
  tests/test_docker_leftovers.py tests/test_docker_python_placement.py tests/test_interrupt_during_evaluation.py \
  tests/test_native_hostile.py tests/test_native_files.py tests/test_multi_file.py tests/test_runtime_attacks.py \
  tests/test_multi_file_store.py \
  tests/test_jail_init.py tests/test_defense_audit.py tests/test_slot_ownership.py tests/test_docker_ownership.py \
  tests/test_reply_attacks.py tests/test_score_deadlines.py \
  "tests/test_db_urls.py::test_an_archive_on_a_read_only_mount_is_read_as_it_is_and_as_a_live_run_writes_it" \
  "tests/test_contention.py::test_a_candidate_outside_the_jail_runs_at_the_lower_cpu_weight" \
  "$@"
