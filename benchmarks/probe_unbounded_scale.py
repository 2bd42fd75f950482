"""Probe: unbounded convex QPs whose P is large against q — which backends still say SOLVED?

Each draw: ``P = s·LLᵀ`` of rank r < n, a null vector d of Lᵀ (so ``P d = 0`` up to rounding), ``q`` with
``qᵀd < 0``, rows C whose one-sided bounds let d through (``C d > 0`` rows bounded below, the others
above). The objective is unbounded below along d; a scale-relative stopping test can accept a point
anyway once ``|Px|`` dwarfs ``|qᵀd|`` (docs/checking_a_backend.md). Prints, per backend, the draws not
answered DUAL_INFEASIBLE, counted by s.

Run::

    .venv/bin/python benchmarks/probe_unbounded_scale.py
"""

from __future__ import annotations

import collections
import warnings

import numpy as np

import polyproj as pp

BACKENDS = ["highs", "clarabel", "piqp", "proxsuite", "osqp", "daqp", "ipm"]
SCALES = [1.0, 1e3, 1e5, 1e7, 1e9]


def draws(rng: np.random.Generator, count: int):
    for _ in range(count):
        n, m = int(rng.integers(3, 12)), int(rng.integers(0, 8))
        r = int(rng.integers(1, n))
        L = rng.standard_normal((n, r))
        s = float(rng.choice(SCALES))
        d = np.linalg.svd(L.T)[2][r:].T[:, 0]
        q = rng.standard_normal(n) - 5.0 * d
        C = rng.standard_normal((m, n))
        cd = C @ d
        l = np.where(cd > 0, -10.0 - rng.random(m), -np.inf)
        u = np.where(cd > 0, np.inf, 10.0 + rng.random(m))
        if q @ d >= 0:
            continue
        yield s, pp.QP(P=s * L @ L.T, q=q, C=C if m else None, l=l if m else None, u=u if m else None)


def main() -> None:
    warnings.simplefilter("ignore")
    problems = list(draws(np.random.default_rng(1), 60))
    print("draws per scale:", dict(collections.Counter(f"{s:.0e}" for s, _ in problems)))
    for be in BACKENDS:
        missed = collections.Counter()
        for s, qp in problems:
            try:
                status = pp.solve_qp(qp, be).status.name
            except pp.PolyprojError as e:
                status = type(e).__name__
            if status != "DUAL_INFEASIBLE":
                missed[f"{s:.0e} {status}"] += 1
        print(f"{be:10s}", dict(sorted(missed.items())) or "all DUAL_INFEASIBLE")


if __name__ == "__main__":
    main()
