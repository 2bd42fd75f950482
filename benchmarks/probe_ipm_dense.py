"""Probe: the batched IPM on general dense QPs (not projections), where its normal equations' floor bites.

Random convex QPs, ``P = LLᵀ/n``, m = 2n one-sided rows with an interior point, ``q ~ 10·N(0, 1)``, solved
one at a time with ``solve_qp(qp, backend="ipm")`` at the default ``eps_abs = 1e-8``; prints the statuses
per n over 10 seeds (docs/ipm.md, "Known limitation").

Run::

    .venv/bin/python benchmarks/probe_ipm_dense.py [--ns 50 100 200 400]
"""

from __future__ import annotations

import argparse
import collections
import time
import warnings

import numpy as np

import polyproj as pp


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", type=int, nargs="+", default=[50, 100, 200], help="dimensions (10 seeds each)")
    args = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    for n in args.ns:
        counts: collections.Counter = collections.Counter()
        iterations = []
        t0 = time.perf_counter()
        for seed in range(10):
            rng = np.random.default_rng(seed)
            m = 2 * n
            C = rng.standard_normal((m, n))
            L = rng.standard_normal((n, n))
            u = C @ rng.standard_normal(n) + rng.random(m)
            qp = pp.QP(L @ L.T / n, 10 * rng.standard_normal(n), C, np.full(m, -np.inf), u)
            sol = pp.solve_qp(qp, backend="ipm")
            counts[sol.status.name] += 1
            iterations.append(sol.iterations)
        print(f"n {n}: {dict(counts)} ({time.perf_counter() - t0:.1f} s; iterations {iterations})")


if __name__ == "__main__":
    main()
