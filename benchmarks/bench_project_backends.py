"""pp.project with every CPU backend on projection-shaped problems: which default suits projections.

Problems (seeded): a polytope with n variables, m inequalities, one equality and bounds on half of
the variables; a batch of points ``x0 + 3 N(0, 1)``. For each backend: wall time of ``pp.project``
(backend solve + exact polish), the share of points polished, the largest constraint violation and
the distance to a reference (ProxSuite at 1e-12, polished). Medians of interleaved repeats, all in
this process on the same data.

Run: ``python benchmarks/bench_project_backends.py [--sizes 20:40:256 50:100:128] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_json

import polyproj as pp


def make_problem(seed: int, n: int, m: int, batch: int):
    rng = np.random.default_rng(seed)
    x0 = rng.normal(size=n)
    A = rng.normal(size=(m, n))
    B = rng.normal(size=(1, n))
    half = rng.random(n) < 0.5
    lb = np.where(half, x0 - rng.uniform(0.5, 2.0, n), -np.inf)
    ub = np.where(half, x0 + rng.uniform(0.5, 2.0, n), np.inf)
    poly = pp.Polyhedron(A=A, a=A @ x0 + rng.uniform(0.1, 1.0, m), B=B, b=B @ x0, lb=lb, ub=ub)
    return poly, x0 + 3.0 * rng.normal(size=(batch, n))


def measure(poly, X, backend: str, ref: np.ndarray) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", pp.PolyprojWarning)
        t0 = time.perf_counter()
        res = pp.project(X, poly, backend=backend)
        wall = time.perf_counter() - t0
    return {"seconds": wall, "polished": float(np.mean(res.polished)), "max_violation": float(res.max_violation),
            "max_error": float(np.nanmax(np.abs(res.y - ref)))}


def _size(spec: str) -> tuple[int, int, int]:
    """``n:m:batch`` as three positive integers (argparse's error otherwise)."""
    try:
        n, m, batch = (int(v) for v in spec.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r} is not n:m:batch (three integers, e.g. 20:40:256)") from None
    if min(n, m, batch) <= 0:
        raise argparse.ArgumentTypeError(f"{spec!r}: n, m and batch must be positive")
    return n, m, batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", type=_size, default=["20:40:256", "50:100:128", "100:200:64"],
                    help="n:m:batch")
    ap.add_argument("--backends", nargs="+", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="project_backends")
    args = ap.parse_args()
    backends = args.backends or [b for b in pp.available_backends() if b != "cupy"]
    rows = []
    for n, m, batch in args.sizes:
        poly, X = make_problem(0, n, m, batch)
        ref = pp.project(X, poly, backend="proxsuite", eps_abs=1e-12).y
        runs: dict[str, list[dict]] = {b: [] for b in backends}
        for _ in range(args.repeats):
            for b in backends:  # interleaved
                runs[b].append(measure(poly, X, b, ref))
        for b in backends:
            secs = [r["seconds"] for r in runs[b]]
            row = {"n": n, "m": m, "batch": batch, "backend": b, "median_s": statistics.median(secs),
                   "min_s": min(secs), "max_s": max(secs), **{k: runs[b][-1][k] for k in
                                                             ("polished", "max_violation", "max_error")}}
            rows.append(row)
            print(f"n {n:4d} m {m:4d} batch {batch:5d} {b:>10}: {row['median_s'] * 1e3:9.1f} ms "
                  f"[{row['min_s'] * 1e3:.1f}, {row['max_s'] * 1e3:.1f}]  polished {row['polished']:.3f}  "
                  f"viol {row['max_violation']:.1e}  err {row['max_error']:.1e}", flush=True)
    write_json(args.out, {"benchmark": "project_backends", "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    main()
