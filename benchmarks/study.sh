#!/usr/bin/env bash
# Issue 36's study, start to end, resumable: run it again after any stop (a kill, a reboot, the end of a
# sitting, a fresh clone) and it goes on from what its results files hold. Niced, for running beside other work:
#   setsid nohup bash benchmarks/study.sh >>benchmarks/results/study.log 2>&1 &
# STUDY_CORES=1 pins it (and llama.cpp's and the trainer's threads) to those cores, so that work on the other
# core does not stall llama.cpp's threads (two processes on the same two cores slow both about tenfold).
# What it writes: benchmarks/results/closed_loop/results.json (finished arms), benchmarks/results/best_at_k/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
run() {
  if [ -n "${STUDY_CORES:-}" ]; then
    EVOLVE_LLAMA_THREADS=$(taskset -c "$STUDY_CORES" nproc) nice -n 19 taskset -c "$STUDY_CORES" "$PY" "$@"
  else
    nice -n 19 "$PY" "$@"
  fi
}
stamp() { echo "=== $(date -u +%FT%TZ) $*"; }
LOOP=(-m benchmarks.closed_loop --problems tour_heuristic,minimizer --groups 16)

stamp "closed loop, seed 0 (pairs every problem's arms first)"
run "${LOOP[@]}" --seeds 1

stamp "best@k on tour_heuristic (minimizer's is in benchmarks/results/best_at_k/minimizer.json)"
BK=benchmarks/results/best_at_k
if [ ! -f "$BK/tour_heuristic.json" ]; then
  tour=$(run -m benchmarks.closed_loop --probe-archive tour_heuristic | tee /dev/stderr | tail -1)
  held=$(run -m benchmarks.closed_loop --probe-archive durations | tee /dev/stderr | tail -1)
  [ -f "$tour" ] && [ -f "$held" ] || { echo "study: no probe archive ($tour, $held)"; exit 1; }
  run -m benchmarks.best_at_k --db "$tour" --held-out-db "$held" --k 12 --prompts 8 --steps 2 \
    --out "$BK/tour_heuristic.json" --work "$BK/work/tour_heuristic"
  cp "$BK/work/tour_heuristic/measured.json" "$BK/tour_heuristic.measured.json"
fi

stamp "closed loop, seeds 1 and 2"
run "${LOOP[@]}" --seeds 3
stamp "study done"
run -m benchmarks.closed_loop --report
