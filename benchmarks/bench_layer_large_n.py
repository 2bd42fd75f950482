"""The torch projection layer at large n (polyproj only): one forward+backward per configuration.

Same problem generator as ``bench_layer.py`` (m = 2n inequalities, one equality, box bounds,
float64, one torch thread). The peers are not run here: at n >= 200 they exceed any time budget
(``bench_layer.py --only n`` records them as skipped). Prints and writes
``benchmarks/results/layer_large_n.json``.

Run::

    .venv/bin/python benchmarks/bench_layer_large_n.py            # n 500 (batch 16), n 1000 (batch 4)
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_layer import build, make_problem
from common import write_json

import polyproj as pp
from polyproj.runtime import set_torch_threads


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["500x16", "1000x4"], help="NxBATCH")
    args = ap.parse_args(argv)

    set_torch_threads(1)
    rows = []
    for cfg in args.configs:
        n, batch = (int(v) for v in cfg.split("x"))
        d = make_problem(batch, n, 2 * n)
        f = build("polyproj", d)
        P = pp.Polyhedron(A=d["A"], a=d["a"], B=d["B"], b=d["b"], lb=d["lb"], ub=d["ub"])
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            y, _ = f()
            times.append(time.perf_counter() - t0)
        viol = float(np.max(P.violation(y.numpy())))
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rows.append(dict(n=n, m=2 * n, batch=batch, times_s=times, max_violation=viol, peak_rss_mib=rss))
        print(f"n {n} batch {batch}: fwd+bwd {times[0]:.2f} s / {times[1]:.2f} s, "
              f"max violation {viol:.1e}, peak RSS {rss:.0f} MiB", flush=True)
    print(f"wrote {write_json('layer_large_n', dict(rows=rows))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
