#!/usr/bin/env python
"""``pp.project`` on long thin polytopes: the ADMM start against DAQP per point, and what ``"auto"`` picks.

Random bounded polytopes (shared A with m = ratio * n rows, one equality, box bounds; points x0 + 3 N(0, 1),
as bench_layer.py's data), each backend named, one warm-up call, then one timed call of the whole batch (the
times are seconds, their spread between runs ~10 %). ``polyproj.backends.defaults.AUTO_THIN`` is set from
this table: from m = 3n rows DAQP per point is as fast or faster at every n and the ADMM start's polish
degrades fast (rounds, then the batched IPM for what it leaves).

Run (one core)::

    taskset -c 1 .venv/bin/python benchmarks/bench_auto_thin.py [--quick]

JSON: ``benchmarks/results/auto_thin.json``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_layer import make_problem
from common import quick_name, write_json

#: (n, ratios m / n, batch)
GRID = [(20, (2, 4, 8), 1024), (50, (2, 3, 4), 512), (100, (2, 2.5, 3, 4), 256), (200, (2, 2.5, 3, 4), 128),
        (400, (2, 3), 32)]
QUICK = [(20, (2, 4), 256), (50, (2, 4), 64)]


def polytope(n: int, m: int, batch: int, seed: int = 0):
    """bench_layer.py's data (:func:`bench_layer.make_problem`) as a Polyhedron and its points."""
    import polyproj as pp

    d = make_problem(batch, n, m, seed)
    return pp.Polyhedron(**{k: d[k] for k in ("A", "a", "B", "b", "lb", "ub")}), d["X"]


def timed(X, P, backend: str) -> tuple[float, str, bool]:
    import polyproj as pp

    pp.project(X[:3], P, backend=backend)
    t0 = time.perf_counter()
    res = pp.project(X, P, backend=backend)
    return time.perf_counter() - t0, res.backend, bool(np.all(res.polished))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small grid (smoke run)")
    args = ap.parse_args(argv)
    rows = []
    for n, ratios, batch in QUICK if args.quick else GRID:
        for ratio in ratios:
            m = int(ratio * n)
            P, X = polytope(n, m, batch)
            row = dict(n=n, m=m, batch=batch)
            for backend in ("admm", "daqp", "auto"):
                t, used, polished = timed(X, P, backend)
                row[backend] = t
                row[f"{backend}_polished"] = polished
                if backend == "auto":
                    row["auto_used"] = used
            rows.append(row)
            print(f"n {n:4d} m {m:5d} batch {batch:5d}: admm {row['admm']:.3f} s, daqp {row['daqp']:.3f} s "
                  f"(admm / daqp {row['admm'] / row['daqp']:.2f}), auto {row['auto']:.3f} s by {row['auto_used']}",
                  flush=True)
    path = write_json(quick_name("auto_thin", args.quick), {"rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
