#!/usr/bin/env bash
# The layer's small-batch points, this checkout against another, alternating on one pinned core: polyproj
# alone through bench_layer (batch 1 and 16 at n 50, batch 128 at n 10), fwd+bwd medians of 31 calls a point.
#
#   git worktree add ../ref 7529563              # e.g. the code before the changes of 2026-12-05 (late evening)
#   bash benchmarks/ab_layer_small.sh ../ref [ROUNDS] [CORE]
#
# Both trees run with this checkout's .venv; JSON per tree and round in $OUT (default /tmp/ab_layer_small).
set -uo pipefail
HERE="$(cd "$(dirname "$0")/.." && pwd)"
REF="$(cd "${1:?usage: ab_layer_small.sh REF_TREE [ROUNDS] [CORE]}" && pwd)"
ROUNDS="${2:-2}"
CORE="${3:-1}"
PY="$HERE/.venv/bin/python"
LOG="${OUT:-/tmp/ab_layer_small}"
mkdir -p "$LOG"
export RAYON_NUM_THREADS=1 PYTHONUNBUFFERED=1
for round in $(seq "$ROUNDS"); do
  for tree in "$REF" "$HERE"; do
    tag="$(basename "$tree")_$round"
    (cd "$tree" && PYTHONPATH="$tree" taskset -c "$CORE" "$PY" benchmarks/bench_layer.py --only batch --batches 1 16 \
      --threads 1 --no-memory --methods polyproj --repeats 31 --tag _ab --out "$LOG/$tag.json" --fresh >/dev/null 2>&1 &&
     PYTHONPATH="$tree" taskset -c "$CORE" "$PY" benchmarks/bench_layer.py --only n --ns 10 --threads 1 --no-memory \
      --methods polyproj --repeats 31 --tag _ab --out "$LOG/$tag.json" >/dev/null 2>&1)
    "$PY" - "$LOG/$tag.json" "$tag" <<'PYEOF'
import json, sys
r = json.load(open(sys.argv[1]))
cells = [f"{'b' if k.startswith('sweep_batch') else 'n'} {c['config']['batch'] if k.startswith('sweep_batch') else c['config']['n']}: "
         f"{1e3 * c['rows'][0]['time_s']:.3f} ms" for k in sorted(r) if k.startswith("sweep") for c in r[k]]
print(sys.argv[2], " | ".join(cells))
PYEOF
  done
done
