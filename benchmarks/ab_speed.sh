#!/usr/bin/env bash
# Speed kept? A/B of two checkouts, interleaved in one session on the same machine state: the
# benchmarks the README's "Speed kept through the restructuring" table quotes.
#
#   git worktree add ../ref wave2-base          # the code before the Projector issue (or any commit)
#   bash benchmarks/ab_speed.sh ../ref [ROUNDS]  # this checkout against ../ref; logs to $OUT or /tmp
#
# Per tree and round: bench_layer --only headline (polyproj and QPLayer), bench_batch at n 100,
# batch 1024 (pp.project ipm, the layer's ADMM, ProxSuite in parallel), bench_projection; once per
# tree and tolerance: the Maros-Meszaros dense subset with the ipm backend, one job. Both trees run
# with this checkout's .venv and OPENBLAS_NUM_THREADS=1.
set -uo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
REF="$(cd "${1:?usage: ab_speed.sh REF_TREE [ROUNDS]}" && pwd)"
ROUNDS="${2:-3}"
PY="$HERE/.venv/bin/python"
DATA="$(cd "$HERE/../shared/data/maros_meszaros" && pwd)"
LOG="${OUT:-/tmp}/ab_speed"
mkdir -p "$LOG"
export OPENBLAS_NUM_THREADS=1 PYTHONUNBUFFERED=1
load() { cut -d' ' -f1 /proc/loadavg; }
for tol in 1e-6 1e-9; do
  for tree in "$REF" "$HERE"; do
    tag=$(basename "$tree")
    echo "=== MM $tol $tag $(date +%T) load $(load)"
    (cd "$tree" && PYTHONPATH="$tree" timeout 1500 "$PY" -m polyproj bench solvers --data "$DATA" --subset dense \
      --tol "$tol" --time-limit 10 --backends ipm --jobs 1 --out "$LOG/mm_${tag}_$tol.json" 2>&1 | grep -E "│ +ipm")
  done
done
for round in $(seq "$ROUNDS"); do
  for tree in "$REF" "$HERE"; do
    tag=$(basename "$tree")
    echo "=== round $round $tag $(date +%T) load $(load)"
    cd "$tree"
    PYTHONPATH="$tree" timeout 900 "$PY" benchmarks/bench_layer.py --only headline --methods polyproj proxsuite_qplayer \
      --repeats 9 --no-memory --out "$LOG/layer_${tag}_$round.json" 2>&1 | grep -E "^  (polyproj|proxsuite_qplayer) "
    PYTHONPATH="$tree" timeout 900 "$PY" benchmarks/bench_batch.py --sizes 100 --batches 1024 --repeats 3 \
      --solvers project-ipm layer-admm proxsuite-parallel --out "$LOG/batch_${tag}_$round" 2>&1 | grep -E "│ 100"
    PYTHONPATH="$tree" timeout 900 "$PY" benchmarks/bench_projection.py --repeats 7 2>&1 | grep -E "pp.project @1e-9|overhead"
    # bench_projection writes the tree's benchmarks/results/projection.json: keep it here, restore the tree's
    cp benchmarks/results/projection.json "$LOG/projection_${tag}_$round.json"
    git checkout -q -- benchmarks/results/projection.json 2>/dev/null || true
  done
done
echo "=== done $(date +%T); JSON in $LOG"
