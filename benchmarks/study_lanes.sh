#!/usr/bin/env bash
# Issue 36's study on both cores at once: two lanes, each a checkout of the study's one code (STUDY_COMMIT) pinned
# to its own core with one llama.cpp thread, niced. Two llama.cpp processes that share both cores slow each other
# about tenfold; one pinned to each core lose nothing to the other, so two lanes finish the grid in about half the
# time of benchmarks/study.sh's one. Each lane has its own (problem, arm) pairs and its own results file (no writer
# is shared), and `collect` merges the finished arms of both into benchmarks/results/ of this checkout, to commit.
#
#   bash benchmarks/study_lanes.sh start     # make the lanes (once per machine) and start what is left
#   bash benchmarks/study_lanes.sh status    # finished arms per lane, the arm each is on, the last lines
#   bash benchmarks/study_lanes.sh collect   # finished arms (rows and archives) and best@k results into this checkout
#   bash benchmarks/study_lanes.sh stop      # kill -9 both lanes, every process in them (archives survive it)
#
# Resumable like study.sh: `start` seeds each lane with this checkout's results, best@k's probe archives and its
# untrained measurements, so what was collected is not run again; an arm cut off resumes from its lane's archive on
# the same machine and starts again on a fresh one.
# STUDY_LANES moves the lanes' checkouts (default: $TMPDIR or /tmp, vpo-study-lanes). STUDY_ARMS=none runs only
# those arms (and no best@k): the untrained arms need no trainer, for a machine whose trainer is too slow.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
STUDY_COMMIT=${STUDY_COMMIT:-a0fcf84}  # a930b8a, the float32 trainer where bf16 is slow, the prompt once a group, the waiting lane's core lent to the update, old logprobs for later minibatches only (docs/training.md)
LANES=${STUDY_LANES:-${TMPDIR:-/tmp}/vpo-study-lanes}
PY=${PYTHON:-python3}
CL=benchmarks/results/closed_loop
BK=benchmarks/results/best_at_k
# Two lanes of about equal work (a trained arm costs about 2.5 untrained ones), disjoint (problem, arm) sets so
# that no arm runs twice, each lane seed by seed so that partial results pair both problems' arms early. The lanes
# take turns to update (STUDY_UPDATE_LOCK): two float32 updates at once would need more than 24 GB. While one lane
# waits for its turn, the update under way borrows its core (benchmarks/lane_cores.py in the study's code).
LANE_NAMES=(one two)
declare -A CORE=([one]=1 [two]=0)
declare -A JOBS=(
  [one]="tour_heuristic:none,grpo minimizer:vpo"
  [two]="tour_heuristic:vpo minimizer:none,grpo"
)

lane_run() {  # lane, then the python arguments: pinned (LANE_CORES, else the lane's core), niced, its checkout first
  local dir=$LANES/$1 core=${LANE_CORES:-${CORE[$1]}}
  shift
  (cd "$dir" && PYTHONPATH="$dir" EVOLVE_LLAMA_THREADS=${LANE_THREADS:-1} STUDY_UPDATE_LOCK="$LANES/update.lock" \
    nice -n 19 taskset -c "$core" "$PY" "$@")
}

only_arms() {  # a job's arms (comma-separated), less those STUDY_ARMS leaves out when it is set
  local arm kept=()
  for arm in ${1//,/ }; do
    [[ -z "${STUDY_ARMS:-}" || ",$STUDY_ARMS," == *",$arm,"* ]] && kept+=("$arm")
  done
  local IFS=,
  echo "${kept[*]}"
}

lane_script() {  # what one lane runs, start to end
  local lane=$1 seeds job arms
  for seeds in 2 3; do
    for job in ${JOBS[$lane]}; do
      arms=$(only_arms "${job#*:}")
      [ -n "$arms" ] || continue
      echo "=== $(date -u +%FT%TZ) lane $lane: ${job%%:*} arms $arms, seeds below $seeds"
      lane_run "$lane" -m benchmarks.closed_loop --problems "${job%%:*}" --arms "$arms" --seeds "$seeds" --groups 16 \
        || echo "lane $lane: exit $? (run start again to resume)"
    done
  done
  if [ "$lane" = one ] && [ -z "${STUDY_ARMS:-}" ] && [ ! -f "$LANES/$lane/$BK/tour_heuristic.json" ]; then
    while running two; do sleep 60; done  # best@k's trainings take no turn with the other lane's updates: wait
    echo "=== $(date -u +%FT%TZ) lane $lane: best@k on tour_heuristic"
    export LANE_CORES=0,1 LANE_THREADS=2  # lane two is done: both cores, every policy of best@k alike
    tour=$(lane_run "$lane" -m benchmarks.closed_loop --probe-archive tour_heuristic | tail -1)
    held=$(lane_run "$lane" -m benchmarks.closed_loop --probe-archive durations | tail -1)
    [ -f "$tour" ] && [ -f "$held" ] || { echo "lane $lane: no probe archive ($tour, $held)"; exit 1; }
    lane_run "$lane" -m benchmarks.best_at_k --db "$tour" --held-out-db "$held" --k 12 --prompts 8 --steps 2 \
      --out "$BK/tour_heuristic.json" --work "$BK/work/tour_heuristic"
    cp "$LANES/$lane/$BK/work/tour_heuristic/measured.json" "$LANES/$lane/$BK/tour_heuristic.measured.json"
  fi
  echo "=== $(date -u +%FT%TZ) lane $lane: done"
}

running() {  # lane: whether any process of its group lives (a lane is a session of its own: setsid)
  [ -f "$LANES/$1/pid" ] && kill -0 -- "-$(cat "$LANES/$1/pid")" 2>/dev/null
}

start() {
  mkdir -p "$LANES"
  # the embedded model's cache, built here once: two lanes building it at once on a fresh machine raced (the
  # study's code, a0fcf84, has no lock on it), and one lost its arms
  (cd "$ROOT" && "$PY" -c 'from policies.embedded import embedded_model_dir; embedded_model_dir()') \
    || { echo "study: cannot build the embedded model's cache (scripts/setup.sh first)"; exit 1; }
  git -C "$ROOT" worktree prune  # lanes of a machine whose /tmp was cleared
  for lane in "${LANE_NAMES[@]}"; do
    dir=$LANES/$lane
    if running "$lane"; then
      echo "lane $lane: already running (process group $(cat "$dir/pid"))"
      continue
    fi
    [ -e "$dir/.git" ] || git -C "$ROOT" worktree add --detach "$dir" "$STUDY_COMMIT" >/dev/null
    if [ "$(git -C "$dir" rev-parse HEAD)" != "$(git -C "$ROOT" rev-parse "$STUDY_COMMIT^{commit}")" ]; then
      git -C "$dir" checkout -q --detach "$STUDY_COMMIT" \
        || { echo "lane $lane: $dir cannot check out $STUDY_COMMIT; remove it or set STUDY_LANES"; exit 1; }
    fi
    mkdir -p "$dir/$CL"
    merge_rows "$ROOT/$CL/results.json" "$dir/$CL/results.json" "$dir/$CL/results.json"
    mkdir -p "$dir/$BK"
    if [ -f "$ROOT/$BK/tour_heuristic.json" ]; then cp "$ROOT/$BK/tour_heuristic.json" "$dir/$BK/"; fi
    # the untrained policy's best@k measurements, which no training changes: a fresh machine measures the trained
    # ones alone (best_at_k.py resumes from its work folder's measured.json)
    untrained=$ROOT/$BK/tour_heuristic.untrained.measured.json
    if [ -f "$untrained" ] && [ ! -f "$dir/$BK/work/tour_heuristic/measured.json" ]; then
      mkdir -p "$dir/$BK/work/tour_heuristic" && cp "$untrained" "$dir/$BK/work/tour_heuristic/measured.json"
    fi
    for probe in "$ROOT/$CL"/probe/*/arm.db; do  # best@k's probe archives, made once: a fresh machine skips them
      [ -f "$probe" ] || continue
      name=$(basename "$(dirname "$probe")")
      if [ ! -f "$dir/$CL/probe/$name/arm.db" ]; then mkdir -p "$dir/$CL/probe/$name" && cp "$probe" "$dir/$CL/probe/$name/"; fi
    done
    (setsid nohup bash "$ROOT/benchmarks/study_lanes.sh" lane "$lane" >>"$dir/study.log" 2>&1 & echo $! >"$dir/pid")
    echo "lane $lane: started on core ${CORE[$lane]}, log $dir/study.log"
  done
}

merge_rows() {  # a b out: the arms of both results files, one row per (problem, seed, arm), a's first
  "$PY" - "$@" <<'EOF'
import json, sys
from pathlib import Path
rows, seen = [], set()
for path in map(Path, sys.argv[1:3]):
    try:
        found = json.loads(path.read_text()) if path.is_file() else []
    except json.JSONDecodeError:  # a lane rewriting it this moment: its new arm waits for the next collect
        print(f"{path}: being written; collect again", file=sys.stderr)
        found = []
    for row in found:
        key = (row["problem"], row["seed"], row["arm"])
        if key not in seen:
            seen.add(key)
            rows.append(row)
Path(sys.argv[3]).write_text(json.dumps(rows, indent=1))
print(f"{sys.argv[3]}: {len(rows)} arms")
EOF
}

collect() {
  for lane in "${LANE_NAMES[@]}"; do
    dir=$LANES/$lane
    [ -d "$dir" ] || continue
    merge_rows "$ROOT/$CL/results.json" "$dir/$CL/results.json" "$ROOT/$CL/results.json"
    "$PY" - "$dir/$CL/results.json" <<'EOF' | while read -r arm; do
import json, sys
from pathlib import Path
p = Path(sys.argv[1])
try:
    rows = json.loads(p.read_text()) if p.is_file() else []
except json.JSONDecodeError:
    rows = []
for r in rows:
    print(f"{r['problem']}-s{r['seed']}-{r['arm']}")
EOF
      for db in arm.db held_out.db; do
        src=$dir/$CL/arms/$arm/$db
        if [ -f "$src" ] && [ ! -f "$ROOT/$CL/arms/$arm/$db" ]; then
          mkdir -p "$ROOT/$CL/arms/$arm" && cp "$src" "$ROOT/$CL/arms/$arm/"
        fi
      done
    done
    for probe in "$dir/$CL"/probe/*/arm.db; do  # a consistent copy (SQLite's backup), the WAL's rows included
      [ -f "$probe" ] || continue
      name=$(basename "$(dirname "$probe")")
      mkdir -p "$ROOT/$CL/probe/$name"
      "$PY" - "$probe" "$ROOT/$CL/probe/$name/arm.db" <<'EOF'
import sqlite3, sys
from pathlib import Path
def groups(path):  # a copy is taken only when the lane's archive has more groups: no churn in the repository
    return sqlite3.connect(path).execute("SELECT count(*) FROM prompts").fetchone()[0] if Path(path).is_file() else -1
if groups(sys.argv[1]) > groups(sys.argv[2]):
    sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))
EOF
    done
    measured=$dir/$BK/work/tour_heuristic/measured.json
    if [ -f "$measured" ]; then
      "$PY" - "$measured" "$ROOT/$BK/tour_heuristic.untrained.measured.json" <<'EOF'
import json, sys
from pathlib import Path
try:
    rows = [r for r in json.loads(Path(sys.argv[1]).read_text()) if r["policy"] == "none"]
except json.JSONDecodeError:  # being written this moment: the next collect takes it
    rows = []
if rows:
    Path(sys.argv[2]).write_text(json.dumps(rows, indent=1))
EOF
    fi
    for f in tour_heuristic.json tour_heuristic.measured.json; do
      if [ -f "$dir/$BK/$f" ]; then cp "$dir/$BK/$f" "$ROOT/$BK/"; fi
    done
  done
  (cd "$ROOT" && "$PY" -m benchmarks.closed_loop --report | tail -4)
}

status() {
  for lane in "${LANE_NAMES[@]}"; do
    dir=$LANES/$lane
    [ -d "$dir" ] || { echo "lane $lane: not made"; continue; }
    state=stopped
    if running "$lane"; then state="running (process group $(cat "$dir/pid"))"; fi
    arms=$(grep -c '"arm"' "$dir/$CL/results.json" 2>/dev/null || true)
    echo "lane $lane on core ${CORE[$lane]}: $state; ${arms:-0} arms in its results file (collected ones too)"
    tail -n 3 "$dir/study.log" 2>/dev/null | cut -c1-200
  done
}

case "${1:-}" in
  start) start ;;
  collect) collect ;;
  status) status ;;
  stop)  # kill -9 each lane's process group, and wait until it is gone (a `start` right after would see it)
    for lane in "${LANE_NAMES[@]}"; do
      if running "$lane"; then kill -9 -- "-$(cat "$LANES/$lane/pid")"; fi
      for _ in $(seq 150); do running "$lane" || break; sleep 0.2; done
    done ;;
  lane) lane_script "$2" ;;
  *) echo "usage: bash benchmarks/study_lanes.sh start|status|collect|stop" >&2; exit 2 ;;
esac
