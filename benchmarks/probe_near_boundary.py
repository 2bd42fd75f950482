"""Probe: points just outside a polyhedron (1e-7, 1e-8, 1e-9 beyond a face) — is each backend's polished answer exact?

A training step leaves points near the previous projection. For random polytopes (n 6, m 10, one equality, box
bounds) and 40 random points each, the points 1e-7, 1e-8 and 1e-9 beyond their projection along the normal (and
the points themselves) are projected with each CPU backend through ``pp.project``; an answer counts as exact
when it is a KKT point to rounding (``polyproj.testing.properties.exact_certificate``). Before the polish's
tightening step (``polish._tighten``) ADMM, HiGHS, the IPM and OSQP returned some of them SOLVED and polished up
to ~1e-8 outside the set.

Run::

    .venv/bin/python benchmarks/probe_near_boundary.py            # 15 polytopes
    .venv/bin/python benchmarks/probe_near_boundary.py --polytopes 4
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np

import polyproj as pp
from polyproj.testing.properties import exact_certificate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.helpers import random_polytope


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--polytopes", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.polytopes < 1:
        ap.error("--polytopes must be >= 1")
    backends = [b for b in ("osqp", "admm", "ipm", "proxsuite", "highs", "clarabel", "piqp")
                if b in pp.available_backends()]
    rng = np.random.default_rng(args.seed)
    bad = dict.fromkeys(backends, 0)
    worst = dict.fromkeys(backends, 0.0)
    total = 0
    warnings.simplefilter("ignore")
    for _ in range(args.polytopes):
        P = random_polytope(rng, 6, 10, 1)
        X = 3 * rng.standard_normal((40, 6))
        Y = pp.project(X, P, backend="daqp").y
        normal = (X - Y) / np.maximum(np.linalg.norm(X - Y, axis=1, keepdims=True), 1e-300)
        Xn = np.vstack([Y + t * normal for t in (1e-7, 1e-8, 1e-9)] + [X])
        total += Xn.shape[0]
        for be in backends:
            r = pp.project(Xn, P, backend=be)
            exact = np.array([exact_certificate(P, Xn[i], r.y[i], r.active[i]) for i in range(Xn.shape[0])])
            bad[be] += int((~exact).sum())
            worst[be] = max(worst[be], float(r.max_violation))
    print(f"{total} points per backend; answers not exact to rounding, and the largest violation:")
    for be in backends:
        print(f"  {be:10s} {bad[be]:5d}   {worst[be]:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
